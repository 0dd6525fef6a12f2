"""python -m tests.prepare: what `make test` needs from the local services that they may lack as
they boot, prepared without stopping or restarting any of them.

Today that is the RabbitMQ management API (a few tests read queue figures and arguments from
it). It is a plugin, off on a freshly installed broker; enabling it is an online change that
leaves the broker's connections alone. When it cannot be enabled this prints why and exits 0:
the tests that need the API then skip with the same reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from ops import management
from shared.settings import Settings

PLUGIN = "rabbitmq_management"
API_WAIT_S = 60.0
POLL_S = 1.0

Run = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)


def prepare_management_api(
    answers: Callable[[], bool],
    which: Callable[[str], str | None] = shutil.which,
    run: Run = run_command,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    wait_s: float = API_WAIT_S,
) -> tuple[bool, str]:
    """(whether the API answers now, one line saying what was done or why it could not be)."""
    if answers():
        return True, "the RabbitMQ management API answers"
    tool = which("rabbitmq-plugins")
    if tool is None:
        return False, (
            f"the RabbitMQ management API is off and rabbitmq-plugins is not on PATH, so {PLUGIN} "
            "cannot be enabled here: the tests that need it will be skipped"
        )
    done = run([tool, "enable", "--quiet", PLUGIN])
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return False, (
            f"`rabbitmq-plugins enable {PLUGIN}` failed (exit {done.returncode}"
            f"{': ' + said[-1] if said else ''}): the tests that need the management API will be skipped"
        )
    deadline = clock() + wait_s
    while clock() < deadline:
        if answers():
            return True, f"enabled {PLUGIN}; the management API answers"
        sleep(POLL_S)
    return False, (
        f"enabled {PLUGIN}, but the management API did not answer within {wait_s:g} s: "
        "the tests that need it will be skipped"
    )


def main() -> int:
    settings = Settings.from_env()
    _ok, said = prepare_management_api(lambda: management.answers(settings))
    print(f"test services: {said}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
