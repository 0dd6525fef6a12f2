"""Redis: the clients, Cluster mode, error translation, every key, and the state kept there (runs,
presence).
"""
