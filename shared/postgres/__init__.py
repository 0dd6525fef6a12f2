"""PostgreSQL: connections, the schema, and the SQL more than one service runs."""
