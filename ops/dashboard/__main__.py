"""python -m ops.dashboard [--host H] [--port P] [--read-only] [--root-path P] [--generate-token]"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Sequence

from ops.dashboard.config import DashboardSettings, is_loopback
from shared.cli import configure_logging, run_main
from shared.settings import Settings

GRACEFUL_SHUTDOWN_S = 3


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ops.dashboard",
        description="The runs, dead letters, workers and queues, live in a browser.",
    )
    parser.add_argument("--host", help="bind address (DASHBOARD_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (DASHBOARD_PORT, default 8080)")
    parser.add_argument("--read-only", action="store_true", default=None, help="refuse every action")
    parser.add_argument("--root-path", help="prefix when served behind a reverse proxy")
    parser.add_argument("--generate-token", action="store_true", help="print a new token and exit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.generate_token:
        print(secrets.token_urlsafe(32))
        return 0
    dash = DashboardSettings.from_env(
        os.environ, host=args.host, port=args.port, read_only=args.read_only, root_path=args.root_path
    )
    settings = Settings.from_env()
    configure_logging(settings.log_level, "dashboard", settings.log_format)
    import uvicorn  # only now: --generate-token and a refused configuration need none of it

    from ops.dashboard.app import build_app

    shown_host = f"[{dash.host}]" if ":" in dash.host else dash.host
    how = "token required" if dash.auth_required else "no auth: loopback only"
    print(f"dashboard: http://{shown_host}:{dash.port}{dash.root_path}/ ({how})", flush=True)
    if dash.auth_required and not is_loopback(dash.host):
        print("dashboard: plain HTTP; put TLS in front of it to use it beyond this machine", file=sys.stderr)
    app = build_app(settings, dash)
    uvicorn.run(
        app,
        host=dash.host,
        port=dash.port,
        root_path=dash.root_path,
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        log_config=None,
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    run_main("dashboard", main)
