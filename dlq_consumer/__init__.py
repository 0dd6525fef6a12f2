"""The dead-letter service: records every message that reaches the dead-letter queue in
PostgreSQL (`record`, `store`, `service`) and lets an operator list, replay and purge them
(`replay`, `python -m dlq_consumer --help`)."""
