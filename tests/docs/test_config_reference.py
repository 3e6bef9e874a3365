"""docs/configuration.md is what docs/gen_config_reference.py generates from the code today."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "docs" / "gen_config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(generator) -> str:
    return generator.render()


def test_the_page_is_up_to_date(generated: str) -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == generated, "docs/configuration.md is stale: run python docs/gen_config_reference.py"


def test_every_setting_of_the_code_is_on_the_page(generated: str) -> None:
    """Spot checks straight from the classes, independent of the generator's table code."""
    import dataclasses

    from retrieval_server.config import ServerConfig
    from verl_evidence.agent_loops.eviomni_loop import EviOmniLoopSettings
    from verl_evidence.agent_loops.search_loop import SearchLoopSettings
    from verl_evidence.reward_managers.judge import JudgeConfig

    for cls in (SearchLoopSettings, EviOmniLoopSettings):
        for field in dataclasses.fields(cls):
            assert f"| `{field.name}` |" in generated, (cls.__name__, field.name)
    for name in JudgeConfig.model_fields:
        assert f"| `nli_{name}` |" in generated
    for name in ServerConfig.model_fields:
        assert f"| `{name}` |" in generated
    assert re.search(r"\| `max_turns` \| int \| `6` \|", generated)
    assert "| `+algorithm.eps_std` | `0.1` |" in generated


def test_a_new_setting_without_a_meaning_fails_the_generator(generator, monkeypatch) -> None:
    monkeypatch.delitem(generator.MEANINGS, "search_loop.topk")
    with pytest.raises(SystemExit, match="search_loop.topk"):
        generator.render()


def test_a_meaning_for_a_removed_setting_fails_the_generator(generator, monkeypatch) -> None:
    monkeypatch.setitem(generator.MEANINGS, "search_loop.no_such_setting", "gone")
    with pytest.raises(SystemExit, match="no_such_setting"):
        generator.render()
