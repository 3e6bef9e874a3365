"""How the ONNX encoder cuts a batch into runs: the least padded work, never a run over the row limit.

Pure numpy (fast tier). The vectors themselves are checked against torch in test_onnx_encoder.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from retrieval_server.encoders import plan_runs


def cost(lengths, plan, overhead):
    return sum(overhead + (stop - start) * lengths[stop - 1] for start, stop in plan)


def brute_force_best(lengths, max_rows, overhead):
    n = len(lengths)
    best = None
    for mask in itertools.product((False, True), repeat=n - 1):  # every set of cut points
        bounds = [0, *[i + 1 for i, cut in enumerate(mask) if cut], n]
        plan = list(itertools.pairwise(bounds))
        if all(stop - start <= max_rows for start, stop in plan):
            value = cost(lengths, plan, overhead)
            best = value if best is None else min(best, value)
    return best


def test_runs_cover_every_text_once_in_order():
    lengths = np.sort(np.random.default_rng(0).integers(5, 60, size=37))
    plan = plan_runs(lengths, max_rows=8)
    assert plan[0][0] == 0 and plan[-1][1] == 37
    assert all(a[1] == b[0] for a, b in itertools.pairwise(plan))
    assert all(0 < stop - start <= 8 for start, stop in plan)


def test_equal_lengths_stay_one_run_and_a_length_jump_is_cut():
    assert plan_runs(np.full(16, 14), max_rows=128) == [(0, 16)]
    # 8 short and 8 long questions: padding the short ones to 28 costs 144 tokens, a second run 12.
    assert plan_runs(np.array([10] * 8 + [28] * 8), max_rows=128) == [(0, 8), (8, 16)]
    # Two lengths one token apart: a second run would cost more than the 8 tokens of padding it saves.
    assert plan_runs(np.array([14] * 8 + [15] * 8), max_rows=128) == [(0, 16)]


@pytest.mark.parametrize("seed", range(20))
def test_the_plan_is_the_cheapest_of_all_cuts(seed):
    rng = np.random.default_rng(seed)
    lengths = np.sort(rng.integers(8, 40, size=int(rng.integers(1, 11))))
    max_rows = int(rng.integers(1, 6))
    plan = plan_runs(lengths, max_rows=max_rows, overhead=12)
    assert all(stop - start <= max_rows for start, stop in plan)
    assert cost(lengths, plan, 12) == pytest.approx(brute_force_best(lengths, max_rows, 12))


def test_no_texts_no_runs():
    assert plan_runs(np.array([], dtype=np.int64), max_rows=8) == []
