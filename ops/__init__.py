"""Operator commands: crawl, status, runs, export, run_report (each `python -m ops.<name>`).

The top layer: ops may import shared, the services (producer, worker, dlq_consumer) and the demo
site; none of those imports ops (tests/unit/test_layers.py).
"""
