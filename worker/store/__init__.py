"""Storing results in PostgreSQL: the rows and their SQL, the writer thread, committing a batch."""
