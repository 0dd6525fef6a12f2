"""Measurements that take real time and real services; run by hand, not by pytest."""
