"""A crawl's Ctrl-C and SIGTERM are noted by the handler and raised where the crawl looks."""

from __future__ import annotations

import os
import signal

import pytest

from ops.crawl_processes import StopRequest, Terminated, sigterm_as_interrupt


def test_nothing_is_raised_before_a_signal() -> None:
    StopRequest().raise_if_stopped()


def test_ctrl_c_raises_keyboard_interrupt_and_sigterm_raises_terminated() -> None:
    ctrl_c, sigterm = StopRequest(), StopRequest()
    ctrl_c.signals.append(signal.SIGINT)
    sigterm.signals.append(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as raised:
        ctrl_c.raise_if_stopped()
    assert not isinstance(raised.value, Terminated)
    with pytest.raises(Terminated):
        sigterm.raise_if_stopped()


def test_the_first_signal_decides_and_later_ones_change_nothing() -> None:
    request = StopRequest()
    request.signals.append(signal.SIGTERM)
    request.signals.append(signal.SIGINT)
    with pytest.raises(Terminated):
        request.raise_if_stopped()


def test_a_real_signal_inside_is_noted_not_raised_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with sigterm_as_interrupt() as request:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handlers run between bytecodes: give them some
            if len(request.signals) == 2:
                break
        assert request.signals == [signal.SIGINT, signal.SIGTERM]
        with pytest.raises(KeyboardInterrupt):
            request.raise_if_stopped()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
