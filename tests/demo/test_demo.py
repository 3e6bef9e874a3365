"""`verl-evidence demo` as CI runs it: the real console script at reduced size, its report checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

pytestmark = pytest.mark.slow

MANAGERS = ("evinote", "composite", "eviomni", "grace")
PNGS = ("reward_components.png", "rewards_by_case.png", "accuracy_by_source.png", "context_tokens.png")
REPO = Path(__file__).resolve().parents[2]
EVAL_DATA = REPO / "tests" / "eval" / "data"


def run_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """The installed console script (tests/conftest.py makes it import this checkout)."""
    script = Path(sys.executable).with_name("verl-evidence")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "verl_evidence.cli"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


def run_demo(out: Path, retrieval_url: str, *extra: str) -> subprocess.CompletedProcess:
    return run_cli("demo", "--retrieval-url", retrieval_url, "--out", str(out), *extra)


def test_the_console_script_runs_this_checkout() -> None:
    result = run_cli("version", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith(f" from {REPO / 'verl_evidence'}"), result.stdout


def check_report(out: Path) -> str:
    report = (out / "report.md").read_text()
    for manager in MANAGERS:
        assert f"### `{manager}`" in report, manager
    for png in PNGS:
        path = out / png
        assert f"]({png})" in report
        with Image.open(path) as img:
            img.verify()
            assert img.format == "PNG"
    assert "RANDOMLY INITIALISED" in report  # no --nli-model: the report says the judge is random
    return report


def separation_rows(report: str) -> dict[tuple[str, str], list[str]]:
    """The 'separates good from bad' table of the report, by (manager, rollout)."""
    section = report.split("## Where each reward separates good from bad behaviour", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[0].startswith("`"):
            rows[(cells[0].strip("`"), cells[1])] = cells
    return rows


def check_good_beats_bad(out: Path, report: str) -> None:
    rows = separation_rows(report)
    assert {manager for manager, _ in rows} == set(MANAGERS)
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for (manager, rollout), cells in rows.items():
        assert cells[7] == "yes", cells  # every good case scores above every bad case
        good = [
            r["rewards"][manager]["score"]
            for r in records
            if r["rollout"] == rollout
            and manager in r["rewards"]
            and r["case"] in ("well_grounded", "note_taking", "correct_refusal")
        ]
        bad = [
            r["rewards"][manager]["score"]
            for r in records
            if r["rollout"] == rollout
            and manager in r["rewards"]
            and r["case"] in ("unsupported", "wrong_refusal", "bad_format")
        ]
        assert good and bad and min(good) > max(bad), (manager, rollout)


@pytest.mark.timeout(960)  # the demo subprocess has 900 s
def test_demo_on_a_small_reference_set(retrieval_server_url, tmp_path) -> None:
    out = tmp_path / "demo"
    result = run_demo(
        out,
        retrieval_server_url,
        "--trajectories",
        str(EVAL_DATA / "trajectories.jsonl"),
        "--qa",
        str(EVAL_DATA / "qa.jsonl"),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"done in \d+s \(9 rollouts\)", result.stdout)
    assert "reward manager evinote" in result.stdout and "where each reward separates" in result.stdout
    report = check_report(out)
    check_good_beats_bad(out, report)
    assert "## Every example" in report and "search/s-t2-good" in report


@pytest.mark.timeout(960)  # the demo subprocess has 900 s
def test_quick_demo_on_the_bundled_reference_trajectories(retrieval_server_url, tmp_path) -> None:
    out = tmp_path / "demo"
    result = run_demo(out, retrieval_server_url, "--quick")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = check_report(out)
    check_good_beats_bad(out, report)
