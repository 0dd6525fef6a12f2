"""HTTP: the address guard and how urllib3 connects through it, a fetch's deadline, outgoing
proxies.
"""
