"""The recipes' length settings against their rows' sizes in Qwen tokens (issue 52 item 5): the table in
docs/recipes.md is recomputed here, and every default PROMPT_LEN / MAX_LENGTH / max_obs_tokens / RESPONSE_LEN must
hold the longest bundled row of its shape."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prompt_token_table import TABLE_END, TABLE_START, markdown_table, measure

REPO = Path(__file__).resolve().parents[2]
HEADROOM = 1.25  # longer passages than the bundled 100-word ones must still fit


@pytest.fixture(scope="module")
def shapes():
    return {shape.name: shape for shape in measure()}


def recipe_default(recipe: str, variable: str) -> int:
    """The number a recipe script gives ``variable`` when the environment does not (``VAR="${VAR:-N}"``)."""
    text = (REPO / "recipes" / f"{recipe}.sh").read_text()
    found = re.search(rf'{variable}="\$\{{{variable}:-(\d+)\}}"', text)
    assert found, f"recipes/{recipe}.sh has no default for {variable}"
    return int(found.group(1))


def test_the_documented_table_is_measured(shapes):
    docs = (REPO / "docs" / "recipes.md").read_text()
    documented = docs[docs.index(TABLE_START) : docs.index(TABLE_END) + len(TABLE_END)]
    assert documented == markdown_table(list(shapes.values())), (
        "docs/recipes.md's prompt-token table is stale: paste what "
        "`.venv/bin/python tests/tokenization/prompt_token_table.py` prints"
    )


@pytest.mark.parametrize(
    ("shape", "recipe", "variable"),
    [
        ("Search-R1 prompt (question only)", "search_r1_baseline", "PROMPT_LEN"),
        ("EviNote prompt (question only)", "evinote_grpo", "PROMPT_LEN"),
        ("EviOmni/LEAR prompt, top-5 passages", "eviomni_grpo", "PROMPT_LEN"),  # lear_grpo.sh runs it
        ("GRACE prompt, 5 passages", "grace_dapo", "PROMPT_LEN"),
        ("EviPath executor prompt, 5 passages", "evipath_sft", "MAX_LENGTH"),
    ],
)
def test_each_recipe_length_holds_its_longest_prompt(shapes, shape, recipe, variable):
    assert recipe_default(recipe, variable) >= HEADROOM * shapes[shape].max


def test_search_results_fit_the_observation_cut_and_the_response_budget(shapes):
    observation = shapes["one search result, top-3 passages (an observation)"].max
    preset = yaml.safe_load((REPO / "recipes" / "presets" / "rollout_preset" / "search.yaml").read_text())
    assert observation <= preset["custom"]["evidence_search"]["max_obs_tokens"]
    for recipe in ("search_r1_baseline", "evinote_grpo"):
        searches = recipe_default(recipe, "MAX_SEARCHES")
        assert recipe_default(recipe, "RESPONSE_LEN") >= HEADROOM * searches * observation
