"""schema.sql is applied statement by statement: the split must keep a DO block whole."""

from __future__ import annotations

from importlib import resources

from shared.postgres.db import _statements


def test_statements_split_at_semicolons_outside_dollar_quotes() -> None:
    ddl = """
-- a comment; with a semicolon
CREATE TABLE a (x int);
DO $$
BEGIN
    ALTER TABLE a ADD COLUMN y int;
EXCEPTION WHEN duplicate_column THEN
    NULL;
END
$$;
CREATE INDEX a_x ON a (x)
"""
    assert _statements(ddl) == [
        "CREATE TABLE a (x int)",
        "DO $$\nBEGIN\n    ALTER TABLE a ADD COLUMN y int;\nEXCEPTION WHEN duplicate_column THEN\n"
        "    NULL;\nEND\n$$",
        "CREATE INDEX a_x ON a (x)",
    ]


def test_the_schema_file_splits_into_whole_statements() -> None:
    statements = _statements(resources.files("shared.postgres").joinpath("schema.sql").read_text())
    assert all(s.count("$$") % 2 == 0 for s in statements)
    assert statements[0].startswith("CREATE TABLE IF NOT EXISTS pages")
    assert any(s.startswith("DO $$") and "SET COMPRESSION lz4;" in s for s in statements)
