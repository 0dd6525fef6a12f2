"""WARC 1.1 (ISO 28500) records of what the worker fetched, one file series per worker process.

records.py turns one exchange into record bytes (headers, digests, one gzip member each);
files.py names, opens, rotates, closes and repairs the files; archive.py is what the handler
holds: it writes a page's records and says where they landed, and makes them durable before
the page's row commits. content_coding.py decodes a body whose raw bytes are kept.
docs/WARC.md says how the pieces keep exactly-once.
"""
