"""Fetching a URL: the HTTP fetcher, the verdict on an answer, the response type, the response
cache.
"""
