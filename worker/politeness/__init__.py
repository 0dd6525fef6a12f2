"""How hard the worker presses on a domain: the gate, its configuration, the shared rate limit in
Redis, robots.txt.
"""
