"""Wilson score intervals against published values."""

from __future__ import annotations

import pytest

from modelsec.robustness import Accuracy, wilson_interval


@pytest.mark.parametrize(
    "k,n,lo,hi",
    [
        # R. G. Newcombe, "Two-sided confidence intervals for the single proportion: comparison of seven
        # methods", Statistics in Medicine 17 (1998) 857-872, Table I, method 3 (Wilson score, no correction).
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0000, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombe_1998(k: int, n: int, lo: float, hi: float) -> None:
    got = wilson_interval(k, n)
    assert got[0] == pytest.approx(lo, abs=5e-5) and got[1] == pytest.approx(hi, abs=5e-5)


def test_edges_and_errors() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(0, 10)[0] == 0.0
    # 17/20 = 0.85 on the point estimate, yet the Wilson lower bound is far below: why the strict rule
    # cannot pass on foolbox's 20 images.
    assert wilson_interval(20, 20)[0] < 0.85
    for k, n in ((-1, 5), (6, 5), (0, -1)):
        with pytest.raises(ValueError):
            wilson_interval(k, n)


def test_accuracy_value() -> None:
    a = Accuracy(17, 20)
    assert a.accuracy == 0.85 and a.wilson95 == wilson_interval(17, 20)
    assert a.to_json() == {"correct": 17, "total": 20, "accuracy": 0.85, "wilson95": list(a.wilson95)}
    assert Accuracy(0, 0).accuracy == 0.0
