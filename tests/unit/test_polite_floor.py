"""bench.polite_floor: the arguments it refuses and how it reads them."""

from __future__ import annotations

import pytest

from bench.polite_floor import parse_args


@pytest.mark.parametrize(
    "argv", [["--hot", "0"], ["--calls", "0"], ["--rounds", "0"], ["--pauses", "0"], ["--pauses", "soon"]]
)
def test_arguments_that_cannot_make_a_measurement_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        parse_args(argv)
    assert refused.value.code == 2


def test_pauses_are_read_as_seconds() -> None:
    assert parse_args(["--pauses", "0.1,1.5"]).pauses == [0.1, 1.5]
