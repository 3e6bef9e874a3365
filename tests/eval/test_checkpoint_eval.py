"""From a checkpoint to the paper's table: two checkpoints of a real smoke training run, side by side, one table.

The checkpoints come from verl's trainer (``recipes/eviomni_grpo.sh --smoke``, a save every step); eval merges
each actor with verl's model merger, generates with the merged model through the EviOmni agent loop, scores with
the ``eviomni`` reward manager, and writes one row per checkpoint. A second run merges nothing and rolls nothing
out again.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from statistics import fmean

import pytest
from typer.testing import CliRunner

from verl_evidence.eval.checkpoints import MERGE_RECORD
from verl_evidence.rewards.qa_metrics import exact_match

# longest_first: trains the shared EviOmni run (eviomni_smoke_run) that later tests read
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400), pytest.mark.longest_first(0)]


def warmed_rows_in_two_sources(path: Path) -> Path:
    """The smoke run's own EviOmni rows (the questions its policy was warmed up on), half labelled NQ, half HotpotQA.

    The bundled rows all carry one data source; two make the table show column groups and the average.
    """
    from verl_evidence.dataprep.rows import read_parquet
    from verl_evidence.local.smoke.cli import prepare

    rows = read_parquet(prepare("eviomni")["VAL_FILES"])
    with path.open("w", encoding="utf-8") as fh:
        for i, row in enumerate(rows):
            fh.write(json.dumps({**row, "data_source": "nq" if i % 2 == 0 else "hotpotqa"}) + "\n")
    return path


def actor_tensor(step_dir: Path, key: str):
    import torch

    state = torch.load(step_dir / "actor" / "model_world_size_1_rank_0.pt", map_location="cpu", weights_only=False)
    tensor = state[key]
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def test_two_checkpoints_of_a_smoke_run_side_by_side_in_one_table(smoke_checkpoints, retrieval_server_url, tmp_path):
    import torch
    from safetensors.torch import load_file

    from verl_evidence.cli import app

    steps = [smoke_checkpoints / "global_step_1", smoke_checkpoints / "global_step_2"]
    data = warmed_rows_in_two_sources(tmp_path / "rows.jsonl")
    out = tmp_path / "eval"
    args = [
        "eval",
        "--checkpoint",
        str(steps[0]),
        "--checkpoint",
        str(steps[1]),
        "--data",
        str(data),
        "--retrieval-url",
        retrieval_server_url,
        "--max-response-tokens",
        "160",
        "--out",
        str(out),
    ]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "global_step_1: merged" in first.output and "global_step_2: merged" in first.output

    # verl's merger wrote each actor's own weights (bf16), and the two steps differ
    merged = {s.name: next((out / "merged").glob(f"{s.name}-*")) for s in steps}
    key = "model.layers.0.mlp.down_proj.weight"
    weights = {name: load_file(d / "model.safetensors")[key] for name, d in merged.items()}
    for step in steps:
        assert torch.equal(weights[step.name], actor_tensor(step, key).bfloat16())
    assert not torch.equal(weights["global_step_1"], weights["global_step_2"])

    # one table: a row per checkpoint, NQ / HotpotQA / Avg with EM, F1 and EviOmni's CR
    lines = (out / "table.md").read_text().splitlines()
    assert lines[0] == "| checkpoint | NQ |  |  | HotpotQA |  |  | Avg |  |  |"
    assert lines[2] == "|  | EM | F1 | CR | EM | F1 | CR | EM | F1 | CR |"
    assert [line.split(" | ")[0] for line in lines[3:5]] == ["| global_step_1", "| global_step_2"]
    assert "## Results" in (out / "report.md").read_text()
    with (out / "table.csv").open() as fh:
        table = {row["checkpoint"]: row for row in csv.DictReader(fh)}
    assert list(table) == ["global_step_1", "global_step_2"]

    # the table's numbers are those of the scored records, policy by policy
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 16 and all(r["error"] is None for r in records)
    assert all("eviomni" in r["rewards"] for r in records)  # scored by the training reward manager
    for name, model_dir in merged.items():
        mine = [r for r in records if r["policy"] == f"hf:{model_dir.resolve()}"]
        assert len(mine) == 8
        for source, label in (("nq", "NQ"), ("hotpotqa", "HotpotQA")):
            group = [r for r in mine if r["data_source"] == source]
            assert table[name][f"{label}/n"] == "4"
            em = fmean(exact_match(r["prediction"] or "", r["golden_answers"]) for r in group)
            assert float(table[name][f"{label}/EM"]) == pytest.approx(em, abs=1e-5)
            ratios = [r["passage_tokens"] / r["evidence_tokens"] for r in group if r["evidence_tokens"]]
            if ratios:
                assert float(table[name][f"{label}/CR"]) == pytest.approx(fmean(ratios), rel=1e-5)
        averaged = fmean(float(table[name][f"{label}/F1"]) for label in ("NQ", "HotpotQA"))
        assert float(table[name]["Avg/F1"]) == pytest.approx(averaged, abs=1e-5)

    # again: the merges are reused (not rewritten) and every example comes from the results cache
    stamps = {name: (d / MERGE_RECORD).stat().st_mtime_ns for name, d in merged.items()}
    results_before = (out / "results.jsonl").read_text()
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "global_step_1: cached merge" in second.output and "global_step_2: cached merge" in second.output
    assert {name: (d / MERGE_RECORD).stat().st_mtime_ns for name, d in merged.items()} == stamps
    assert sorted(p.name for p in (out / "merged").iterdir() if p.is_dir()) == sorted(d.name for d in merged.values())
    assert (out / "results.jsonl").read_text() == results_before
