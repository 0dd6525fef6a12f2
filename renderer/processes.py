"""What /proc says of the browser's processes: which there are, and their memory.

Playwright starts Chromium detached, in a process group of its own led by the browser process,
and every zygote, renderer and utility process Chromium forks stays in that group. So a group
id names a whole browser: its memory is the sum over the group, and one `killpg` ends it,
children forked a moment ago included (renderer/watchdog.py).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    pgid: int
    rss_bytes: int
    started: int  # clock ticks after boot: with the pid, names the process across pid reuse
    command: str  # its arguments, spaces between


def read_process(pid: int) -> ProcessInfo | None:
    """None for a process that is gone (or not readable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read().decode("utf-8", "replace")
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline_file:
            command = cmdline_file.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return None
    # The command name in parentheses may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie holds no memory and needs no kill, only its parent's wait
        return None
    return ProcessInfo(
        pid=pid,
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        rss_bytes=int(fields[21]) * PAGE_BYTES,
        started=int(fields[19]),
        command=command,
    )


def all_processes() -> list[ProcessInfo]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (info := read_process(int(name))) is not None:
            found.append(info)
    return found


def descendants(root: int, table: list[ProcessInfo] | None = None) -> list[ProcessInfo]:
    """Every process below `root`, children before their own children."""
    table = all_processes() if table is None else table
    children: dict[int, list[ProcessInfo]] = {}
    for info in table:
        children.setdefault(info.ppid, []).append(info)
    found: list[ProcessInfo] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def browser_groups(root: int) -> list[int]:
    """The process groups of the Chromium browsers below `root`: the group leaders whose
    command names chromium (the watchdog leads a group of its own too, and is no browser)."""
    return [p.pid for p in descendants(root) if p.pid == p.pgid and "chrom" in p.command.split(" ", 1)[0]]


def group_members(pgid: int, table: list[ProcessInfo] | None = None) -> list[ProcessInfo]:
    table = all_processes() if table is None else table
    return [info for info in table if info.pgid == pgid]


def group_memory_bytes(pgid: int) -> int:
    """The memory of a whole browser: the sum of its processes' proportional set sizes, so the
    pages they share (Chromium's code, the zygote's heap) are counted once, not once a process."""
    return sum(proportional_bytes(info.pid) for info in group_members(pgid))


def proportional_bytes(pid: int) -> int:
    """A process's PSS from /proc/<pid>/smaps_rollup; 0 for one that is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def kill_group(pgid: int, signal_number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal_number)
