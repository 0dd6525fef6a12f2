"""python -m ops.dashboard: the runs, one run, the dead letters, the workers and the queues in a
browser, live, with pause, resume, cancel, replay and purge.

Layers, each a module:
- config.py     DashboardSettings (DASHBOARD_*), and when a configuration may not serve
- security.py   the Guard middleware: Host allow-list, unsafe-method gate, auth, origin, CSRF,
                read-only; the security headers
- data.py, deadletters.py, workers.py, health.py   read models, on ops.status.gather,
                ops.accounting, dlq_consumer.store and shared.presence; nothing here writes
- regions.py    each view's context and its regions (fragments of templates/_partials)
- sampler.py    one sampler per live view, shared by every viewer of it
- actions.py    the five actions as background operations, with audit rows (operator_actions)
- views.py, api.py, action_routes.py, events.py   HTML pages, JSON, POST actions, SSE streams
- app.py        build_app; __main__.py the command

It controls no process and runs no code from a request. Without DASHBOARD_TOKEN it serves
loopback only; docs/OPERATING.md ("The dashboard") says how to run it and what each page shows.
"""
