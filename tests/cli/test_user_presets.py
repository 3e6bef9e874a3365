"""A reward preset of one's own, as docs/reward-managers.md shows it: the file's shape, kept in the user's directory
through ``hydra.searchpath`` on a recipe's command line, read by the pre-flight check exactly as the trainer composes
it; the wrong shapes and a search path without verl's config stop the run naming the file and the right shape.

Fast tier: the recipe runs with ``--dry-run`` (it prints the trainer command) and the pre-flight check composes
that command in this process, as the recipe runs it before the trainer.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from recipe_commands import REPO, dry_run, trainer_argv

sys.path.insert(0, str(REPO / "recipes"))

import preflight

PAGE = REPO / "docs" / "reward-managers.md"
DECLARED_GPUS = "+ray_kwargs.ray_init.num_gpus=8"  # what Ray is told the node has (the CPU mode does the same)


def section() -> str:
    text = PAGE.read_text()
    return text.split("### A reward preset of your own", 1)[1].split("\n### ", 1)[0]


def documented_preset() -> tuple[str, str]:
    """The page's preset file (its name from its comment) and its text."""
    block = re.search(r"```yaml\n(.*?)```", section(), re.S).group(1)
    name = re.search(r"reward_preset/(\w+)\.yaml", block).group(1)
    return name, block


def documented_command(presets: Path) -> list[str]:
    """The page's recipe command, its placeholder directory replaced by ``presets``."""
    block = re.search(r"```bash\n(.*?)```", section(), re.S).group(1)
    import shlex

    words = shlex.split(block.replace("\\\n", " "))
    assert words[:2] == ["bash", "recipes/evinote_grpo.sh"], words
    return [word.replace("/home/me/my_presets", str(presets)) for word in words[2:]]


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    """Rows `verl-evidence data qa --method evinote` writes, as far as the check reads them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    question = "Which river flows through Cairo?"
    row = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": f"Answer the question. Question: {question}"}],
        "ability": "fact-reasoning",
        "agent_name": "evidence_search",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Nile"], "evidence": []}},
        "extra_info": {"index": 0, "question": question, "method": "evinote", "split": "train"},
    }
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([row, {**row, "extra_info": {**row["extra_info"], "index": 1}}]), path)
    return path


@pytest.fixture(autouse=True)
def local_ray(monkeypatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "local")  # no other user's Ray cluster is this check's


def write_preset(directory: Path, name: str, text: str) -> Path:
    path = directory / "reward_preset" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def recipe_argv(presets: Path, rows: Path, *args: str) -> list[str]:
    """The trainer command the recipe prints for the documented command (and ``args`` instead of its own), with
    the rows and the GPUs this check may assume."""
    done = dry_run("evinote_grpo.sh", *(args or documented_command(presets)), ALLOW_DEMO_CORPUS="1")
    assert done.returncode == 0, done.stderr
    return [*trainer_argv(done.stdout), f"data.train_files={rows}", "data.val_files=null", DECLARED_GPUS]


def test_the_documented_preset_in_ones_own_directory_is_the_one_the_run_composes(tmp_path: Path, rows: Path) -> None:
    name, text = documented_preset()
    presets = tmp_path / "my_presets"
    write_preset(presets, name, text)
    argv = recipe_argv(presets, rows)
    assert f"hydra.searchpath=[pkg://verl.trainer.config,file://{presets}]" in argv  # passed to the trainer as given
    assert f"reward_preset={name}" in argv
    config_path, config_name, overrides = preflight.split_argv(argv)
    cfg = preflight.compose(config_path, config_name, overrides)
    assert cfg.reward.reward_manager.name == "composite"
    weights = [(c["reward"], c["weight"]) for c in preflight.plain(cfg.reward.reward_kwargs.components)]
    assert weights == [("evinote", 1.0), ("verl_evidence.rewards.answer:answer_f1", 0.25)]
    assert preflight.preset_file(cfg, "reward_preset", name) == presets / "reward_preset" / f"{name}.yaml"
    assert preflight.check(argv) == []  # EviNote's rows and search loop fit both components


@pytest.mark.parametrize(
    ("text", "landed"),
    [
        ("# @package reward\nreward:\n  reward_manager: {source: register, name: grace}\n", "reward.reward"),
        ("reward:\n  reward_manager: {source: register, name: grace}\n", "reward_preset"),
        ("reward_manager: {source: register, name: grace}\n", "reward_preset"),
    ],
    ids=["top-level reward key", "neither header nor level", "no header"],
)
def test_a_preset_in_another_shape_stops_the_run_naming_its_file_and_the_shape(
    tmp_path: Path, rows: Path, text: str, landed: str
) -> None:
    """Composed as it is, such a file leaves verl's default reward (naive) in place: the run would train on it."""
    presets = tmp_path / "my_presets"
    path = write_preset(presets, "my_mix", text)
    argv = recipe_argv(presets, rows)
    with pytest.raises(preflight.PreflightError) as refused:
        preflight.check(argv)
    message = str(refused.value)
    assert f"reward preset 'my_mix' ({path}) is not read as a reward preset: its keys landed under {landed}" in message
    assert "verl's 'naive' manager" in message
    assert "`# @package reward` as its first line, then reward_manager:, reward_kwargs:" in message
    assert "no `reward:` key above them" in message and "A reward preset of your own" in message


def test_a_search_path_without_verls_config_is_refused_with_the_one_to_write(tmp_path: Path, rows: Path) -> None:
    presets = tmp_path / "my_presets"
    write_preset(presets, "my_mix", documented_preset()[1])
    override = f"hydra.searchpath=[file://{presets}]"
    with pytest.raises(preflight.PreflightError) as refused:
        preflight.check(recipe_argv(presets, rows, "reward_preset=my_mix", override))
    message = str(refused.value)
    assert f"the override {override!r} replaces the presets' search path" in message
    assert "'hydra.searchpath=[pkg://verl.trainer.config,file:///abs/path/to/my_presets]'" in message


def test_a_preset_without_requires_names_the_file_in_the_users_directory(tmp_path: Path, rows: Path) -> None:
    """The advice names where the file is, not recipes/presets/reward_preset/<name>.yaml."""
    presets = tmp_path / "my_presets"
    own = "# @package reward\nreward_manager: {source: register, name: naive}\n"
    own += "custom_reward_function: {path: 'pkg://my_project.rewards', name: compute_score}\n"
    path = write_preset(presets, "mine", own)
    override = f"hydra.searchpath=[pkg://verl.trainer.config,file://{presets}]"
    with pytest.raises(preflight.PreflightError) as refused:
        preflight.check(recipe_argv(presets, rows, "reward_preset=mine", override))
    assert f"add a `requires:` block with its rollout, data command and row fields to {path} " in str(refused.value)
