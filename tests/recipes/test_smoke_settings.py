"""The smoke runs' one table of per-method needs."""

from __future__ import annotations

import pytest

from verl_evidence.local.smoke import settings
from verl_evidence.local.smoke.data import DATA_KINDS
from verl_evidence.local.smoke.settings import SMOKE_METHODS, WARMUP_STEPS, smoke_method


def test_every_method_names_known_data_and_a_known_warm_up_family() -> None:
    assert set(SMOKE_METHODS) == {"eviomni", "lear", "evinote", "search_r1", "grace", "composite", "evipath_sft"}
    for name, method in SMOKE_METHODS.items():
        assert (method.data is None) == (method.family is None), name  # SFT alone trains on the warm-up data
        assert method.data is None or method.data in DATA_KINDS, name
        assert method.family is None or method.family in WARMUP_STEPS, name
    # the search family's observation cut and response budget reach both search recipes
    for name in ("evinote", "search_r1"):
        assert SMOKE_METHODS[name].settings["MAX_OBS_TOKENS"] == str(settings.SMOKE_MAX_OBS_TOKENS)
        assert SMOKE_METHODS[name].settings["RESPONSE_LEN"] == str(settings.SMOKE_SEARCH_RESPONSE_LEN)
    assert [name for name, method in SMOKE_METHODS.items() if method.nli_judge] == ["evinote"]


def test_an_unknown_method_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown smoke method 'nope'; one of eviomni, lear, evinote"):
        smoke_method("nope")
