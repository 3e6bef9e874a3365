"""The one reader of verl's per-step metrics (verl_evidence.local.smoke.logs), on files verl's FileLogger writes."""

from __future__ import annotations

import numpy as np
from verl.utils.tracking import FileLogger

from verl_evidence.local.smoke.logs import METRICS_LINE, MetricsTail, metrics_path, read_metrics


def file_logger(path, monkeypatch) -> FileLogger:
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    return FileLogger("verl-evidence", "smoke")


def test_every_step_as_verl_logged_it_numbers_only(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    logger = file_logger(path, monkeypatch)
    logger.log({"val-core/nq/reward/mean@2": np.float64(0.25)}, step=0)
    logger.log(
        {
            "critic/score/mean": np.float32(0.5),
            "num_turns/max": np.int32(3),
            "flag": True,
            "reward/eviomni/format/mean": 0.125,
            "note": "text",
            "training/global_step": 1,
        },
        step=1,
    )
    logger.finish()
    assert read_metrics(path) == {
        0: {"val-core/nq/reward/mean@2": 0.25},
        1: {
            "critic/score/mean": 0.5,
            "num_turns/max": 3.0,
            "flag": 1.0,
            "reward/eviomni/format/mean": 0.125,
            "training/global_step": 1.0,
        },
    }


def test_the_tail_returns_each_step_once_and_waits_for_a_whole_line(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.new_steps() == {}  # nothing written yet
    logger = file_logger(path, monkeypatch)
    logger.log({"critic/score/mean": 0.5}, step=1)
    assert tail.new_steps() == {1: {"critic/score/mean": 0.5}}
    assert tail.new_steps() == {}
    with open(path, "a", encoding="utf-8") as handle:  # a line being written
        handle.write('{"step": 2, "data": {"critic/score')
    assert tail.new_steps() == {}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('/mean": 0.75}}\n')
    assert tail.new_steps() == {2: {"critic/score/mean": 0.75}}


def test_the_path_a_smoke_run_printed():
    output = f"# smoke run on CPU: preparing\n{METRICS_LINE}/tmp/x/metrics.jsonl\n# trainer:\n"
    assert str(metrics_path(output)) == "/tmp/x/metrics.jsonl"
    assert metrics_path("no such line") is None
