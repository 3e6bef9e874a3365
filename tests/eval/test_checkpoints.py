"""``--checkpoint``: a verl actor checkpoint is checked, merged once by verl's own merger, merged again when changed.

These tests write the actor directory verl's FSDP checkpoint manager writes at world size 1
(``model_world_size_1_rank_0.pt``, ``fsdp_config.json``, ``huggingface/``) from a tiny model;
tests/eval/test_checkpoint_eval.py does the same with the checkpoints of a real smoke training run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_evidence.eval import checkpoints
from verl_evidence.eval.checkpoints import CheckpointError, checkpoint_labels, find_checkpoint, merge_checkpoint


def write_actor_checkpoint(step_dir: Path, seed: int = 0) -> dict:
    """A ``global_step_N`` directory as verl saves one from a single training process; returns the state dict."""
    import torch

    from verl_evidence.local.tiny_models import tiny_causal_lm, tiny_tokenizer

    model = tiny_causal_lm(seed=seed)
    actor = step_dir / "actor"
    model.config.architectures = [type(model).__name__]  # as save_pretrained (and verl's manager) record it
    model.config.save_pretrained(actor / "huggingface")
    tiny_tokenizer().save_pretrained(actor / "huggingface")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(state, actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    return state


def merged_weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")


def test_merge_runs_once_and_again_when_the_shards_change(tmp_path) -> None:
    import torch

    step = tmp_path / "run" / "global_step_3"
    state = write_actor_checkpoint(step, seed=0)
    cache = tmp_path / "merged"

    first = merge_checkpoint(find_checkpoint(step), cache)
    assert first.merged_now and first.model_dir.parent == cache.resolve()
    assert first.model_dir.name.startswith("global_step_3-")
    weights = merged_weights(first.model_dir)
    # verl's merger writes bf16 copies of the actor's tensors
    key = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(weights[key], state[key].bfloat16())
    record = json.loads((first.model_dir / checkpoints.MERGE_RECORD).read_text())
    assert record["checkpoint"] == str(step.resolve()) and record["key"] == first.key
    stamp = (first.model_dir / "model.safetensors").stat().st_mtime_ns

    again = merge_checkpoint(find_checkpoint(step), cache)
    assert not again.merged_now and again.model_dir == first.model_dir
    assert (again.model_dir / "model.safetensors").stat().st_mtime_ns == stamp  # not written again

    # the same step saved anew (a resumed run) with other weights: a new key, merged again
    new_state = write_actor_checkpoint(step, seed=1)
    changed = merge_checkpoint(find_checkpoint(step), cache)
    assert changed.merged_now and changed.key != first.key and changed.model_dir != first.model_dir
    assert torch.equal(merged_weights(changed.model_dir)[key], new_state[key].bfloat16())
    assert not torch.equal(new_state[key], state[key])
    assert not first.model_dir.exists()  # the merge of the earlier weights is removed


def test_the_actor_directory_itself_is_accepted(tmp_path) -> None:
    step = tmp_path / "global_step_1"
    write_actor_checkpoint(step)
    assert find_checkpoint(step / "actor") == find_checkpoint(step)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("no_dir", "no such directory"),
        ("no_actor", "no actor/ directory with FSDP shards"),
        ("no_shards", "no actor FSDP shards (model_world_size_<N>_rank_<r>.pt)"),
        ("no_config", "fsdp_config.json (the shards' world size) missing"),
        ("missing_rank", "incomplete, missing model_world_size_2_rank_1.pt"),
        ("no_hf_config", "actor/huggingface/config.json missing"),
    ],
)
def test_a_bad_checkpoint_is_one_line_naming_the_directory_and_exit_code_2(tmp_path, damage, expected) -> None:
    from verl_evidence.cli import app

    step = tmp_path / "global_step_7"
    if damage != "no_dir":
        write_actor_checkpoint(step)
    actor = step / "actor"
    if damage == "no_actor":
        for path in sorted(actor.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        actor.rmdir()
    elif damage == "no_shards":
        (actor / "model_world_size_1_rank_0.pt").unlink()
    elif damage == "no_config":
        (actor / "fsdp_config.json").unlink()
    elif damage == "missing_rank":
        (actor / "fsdp_config.json").write_text(json.dumps({"world_size": 2}))
        (actor / "model_world_size_1_rank_0.pt").rename(actor / "model_world_size_2_rank_0.pt")
    elif damage == "no_hf_config":
        (actor / "huggingface" / "config.json").unlink()

    with pytest.raises(CheckpointError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        find_checkpoint(step)
    result = CliRunner().invoke(app, ["eval", "--checkpoint", str(step), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: --checkpoint {step.resolve() if step.exists() else step}")
    assert expected in lines[0]
    assert not (tmp_path / "out" / "merged").exists()  # nothing merged for a bad checkpoint


def test_the_same_checkpoint_twice_and_checkpoint_with_another_policy_are_refused(tmp_path) -> None:
    from verl_evidence.cli import app

    step = tmp_path / "global_step_1"
    write_actor_checkpoint(step)
    twice = CliRunner().invoke(app, ["eval", "--checkpoint", str(step), "--checkpoint", str(step / "actor")])
    assert twice.exit_code == 2 and "is given twice" in twice.output
    both = CliRunner().invoke(app, ["eval", "--checkpoint", str(step), "--model", str(step)])
    assert both.exit_code != 0 and "--checkpoint is the policy" in both.output


def test_row_labels_tell_checkpoints_apart_with_as_few_parents_as_needed() -> None:
    paths = [
        Path("/c/evinote/global_step_100"),
        Path("/c/search_r1/global_step_100"),
        Path("/c/evinote/global_step_200"),
    ]
    assert checkpoint_labels(paths) == [
        "evinote/global_step_100",
        "search_r1/global_step_100",
        "evinote/global_step_200",
    ]
    assert checkpoint_labels(paths[:1] + paths[2:]) == ["global_step_100", "global_step_200"]
