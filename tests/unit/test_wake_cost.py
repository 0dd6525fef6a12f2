"""bench.wake_cost: its arguments, and that each kind of work does what it stands for."""

from __future__ import annotations

import pytest

from bench.wake_cost import HandOff, SocketWork, cpu_us_per_call, parse_args


@pytest.mark.parametrize("argv", [["--calls", "0"], ["--pauses", "0"], ["--pauses", "half"]])
def test_arguments_that_cannot_make_a_measurement_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        parse_args(argv)
    assert refused.value.code == 2


def test_pauses_are_read_as_seconds() -> None:
    assert parse_args(["--pauses", "0.01,0.2"]).pauses == [0.01, 0.2]


def test_a_hand_off_comes_back_every_time() -> None:
    hand_off = HandOff()
    for _ in range(50):
        hand_off()  # would hang if a token were lost
    assert not hand_off.there.is_set() and not hand_off.back.is_set()


def test_the_socket_work_leaves_nothing_unread() -> None:
    work = SocketWork()
    try:
        work()
        for end in (work.near, work.far):
            end.setblocking(False)
            with pytest.raises(BlockingIOError):
                end.recv(1)
    finally:
        work.close()


def test_cpu_a_call_is_measured_in_microseconds() -> None:
    assert cpu_us_per_call(lambda: sum(range(10_000)), calls=20, pause_s=0.0) > 0
