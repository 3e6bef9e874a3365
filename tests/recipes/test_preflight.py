"""recipes/preflight.py through the recipes: a reward whose rows or rollout do not fit stops the run before it starts.

The rows come from the real data commands (`verl-evidence data qa|grace bundled`); the trainer is a stand-in only in
the matching case (a `python` wrapper that runs the real pre-flight check and reports the trainer command instead of
training).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
PRESETS = RECIPES / "presets"
CLI = str(Path(sys.executable).with_name("verl-evidence"))


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, Path]:
    """One parquet file per data command, from the bundled questions."""
    out = tmp_path_factory.mktemp("rows")
    commands = {
        "qa": [CLI, "data", "qa", "bundled", "--method", "evinote", "-o", str(out / "qa.parquet")],
        "grace": [CLI, "data", "grace", "bundled", "--retriever", "bm25", "-o", str(out / "grace.parquet")],
    }
    for command in commands.values():
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 0, result.stderr[-2000:]
    return {name: out / f"{name}.parquet" for name in commands}


def stand_in_python(tmp_path: Path) -> Path:
    """Runs everything with the real interpreter except the trainer, whose command line it prints."""
    python = tmp_path / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1 $2" = "-m verl.trainer.main_ppo" ]; then echo "TRAINER STARTED"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return python


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_recipe(script: str, python: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RETRIEVAL_URL", "SERVER_ARGS", "ALLOW_DEMO_CORPUS")}
    return subprocess.run(
        ["bash", str(RECIPES / script), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**base, "PYTHON": str(python), **env},
    )


@pytest.mark.slow  # the data commands and the Hydra composition in subprocesses
def test_grace_on_search_rows_stops_before_anything_starts(rows, tmp_path: Path) -> None:
    """evinote_grpo.sh reward_preset=grace on `data qa` rows: GRACE would call every question unanswerable."""
    port = free_port()  # a local URL with no server: the recipe would start one, but only after the check
    result = run_recipe(
        "evinote_grpo.sh",
        stand_in_python(tmp_path),
        "reward_preset=grace",
        TRAIN_FILES=str(rows["qa"]),
        VAL_FILES=str(rows["qa"]),
        RETRIEVAL_URL=f"http://127.0.0.1:{port}",
        SERVER_ARGS=f"--index-dir {tmp_path / 'index'}",
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "reward preset 'grace'" in result.stderr
    assert "use rollout_preset=single_turn" in result.stderr
    assert f"rows of {rows['qa']} lack reward_model.ground_truth.answerable" in result.stderr
    assert "`verl-evidence data grace`" in result.stderr
    assert "TRAINER STARTED" not in result.stdout
    with pytest.raises(OSError):  # and no retrieval server was started for it
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.mark.slow  # the data commands and the Hydra composition in subprocesses
def test_search_rows_under_the_grace_recipe_name_their_loop(rows, tmp_path: Path) -> None:
    """The rows' agent_name column wins over the rollout preset in verl: rows for a search loop are caught too."""
    result = run_recipe("grace_dapo.sh", stand_in_python(tmp_path), TRAIN_FILES=str(rows["qa"]), VAL_FILES="null")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "name agent loop 'evidence_search' in their agent_name column" in result.stderr
    assert "TRAINER STARTED" not in result.stdout


@pytest.mark.slow  # the data commands and the Hydra composition in subprocesses
@pytest.mark.parametrize(
    ("script", "data", "args"),
    [
        ("grace_dapo.sh", "grace", []),
        ("grace_dapo.sh", "grace", ["reward_preset=grace"]),
        ("evinote_grpo.sh", "grace", ["reward_preset=grace", "rollout_preset=single_turn"]),
        ("search_r1_baseline.sh", "qa", []),
        ("search_r1_baseline.sh", "qa", ["reward_preset=evinote"]),
    ],
)
def test_matching_reward_rollout_and_rows_start_the_trainer(rows, tmp_path: Path, script, data, args) -> None:
    result = run_recipe(
        script,
        stand_in_python(tmp_path),
        "--no-server",
        *args,
        TRAIN_FILES=str(rows[data]),
        VAL_FILES=str(rows[data]),
        RETRIEVAL_URL="http://127.0.0.1:9",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "# pre-flight: reward, rollout and data fit" in result.stderr
    assert "TRAINER STARTED" in result.stdout


@pytest.mark.slow  # the Hydra composition in a subprocess
def test_missing_data_and_an_undescribed_reward_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.parquet"
    absent = run_recipe("grace_dapo.sh", stand_in_python(tmp_path), TRAIN_FILES=str(missing), VAL_FILES="null")
    assert absent.returncode == 2 and f"data.train_files: {missing} does not exist" in absent.stderr, absent.stderr
    unknown = run_recipe(
        "grace_dapo.sh",
        stand_in_python(tmp_path),
        "reward.reward_manager.name=naive",
        TRAIN_FILES=str(missing),
    )
    assert unknown.returncode == 2 and "no reward preset" in unknown.stderr and "PREFLIGHT=0" in unknown.stderr


def test_every_reward_preset_states_what_it_needs() -> None:
    rollouts = {path.stem for path in (PRESETS / "rollout_preset").glob("*.yaml")}
    table = (REPO / "docs" / "recipes.md").read_text()
    for path in sorted((PRESETS / "reward_preset").glob("*.yaml")):
        need = yaml.safe_load(path.read_text())["requires"]
        assert need["name"] == path.stem
        assert set(need["rollout"]) <= rollouts, (path.name, need["rollout"])
        assert need["data"].startswith("verl-evidence data ") and need["row_fields"], path.name
        assert f"| `{path.stem}` |" in table, f"docs/recipes.md: no requirements row for {path.stem}"
