"""The trainer's phase reaches the reward: GRACE validation scores with alpha = beta = 1 whatever the file says.

The path is verl's, step by step, without Ray: a GRACE file built with the
defaults (``--split train``) read by verl's RLHFDataset and collate_fn, the
validation batch made as ``PPOTrainer._validate`` (v1) makes it, the phase
marked as ``PhaseAgentLoopManager.generate_sequences`` marks it before
dispatch, each row taken out as ``AgentLoopWorkerTQ.generate_sequences`` takes
it, the reward ``DataProto`` built as ``AgentLoopWorker._compute_score`` builds
it, then scored by verl's ``RewardLoopWorker`` with the ``grace_dapo`` preset
(verl's DAPO manager + GRACE's scoring function, alpha = 2, beta = 3) and with
the plugin's ``grace`` manager.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from conftest import run

import verl_evidence.reward_managers  # noqa: F401  (registration)

REPO = Path(__file__).resolve().parents[2]
PHASE_MANAGER = "verl_evidence.reward_managers.phase.PhaseAgentLoopManager"


@pytest.fixture(scope="module")
def default_grace_file(tmp_path_factory) -> Path:
    from typer.testing import CliRunner

    from verl_evidence.cli import app

    out = tmp_path_factory.mktemp("grace") / "grace.parquet"
    result = CliRunner().invoke(app, ["data", "grace", "bundled", "--retriever", "oracle", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def trainer_batch(path: Path, tokenizer_dir: Path, validate: bool, count: int = 2):
    """The first ``count`` answerable rows as the v1 trainer hands them to the agent loop manager."""
    import numpy as np
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 16384,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "truncation": "error",
            "cache_dir": str(path.parent / "cache"),
        }
    )
    dataset = RLHFDataset(str(path), AutoTokenizer.from_pretrained(tokenizer_dir), config)
    items = [dataset[i] for i in range(len(dataset))]
    items = [item for item in items if item["reward_model"]["ground_truth"]["answerable"]][:count]
    batch_dict = collate_fn(items)
    batch_dict["uid"] = np.array([f"uid-{i}" for i in range(len(items))], dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 3)
    if validate:  # PPOTrainer._validate; a training step sets no such entry
        tu.assign_non_tensor_data(batch, "validate", True)
    return batch


def dispatched_rows(batch) -> list[dict]:
    """Each row as AgentLoopWorkerTQ.generate_sequences passes it to the agent loop and the reward."""
    import torch
    from tensordict import NonTensorData, NonTensorStack

    rows = []
    for i in range(len(batch)):
        row = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                row[key] = value[i]
            elif isinstance(value, NonTensorStack):
                row[key] = value[i].data
            elif isinstance(value, NonTensorData):
                row[key] = value.data
        row.pop("validate", None)  # the worker pops it: the reward never sees it
        rows.append(row)
    return rows


def grace_dapo_config(tokenizer_dir: Path):
    """The grace_dapo recipe preset, composed by Hydra as the recipe composes it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "recipes" / "presets"), version_base=None):
        # data.max_response_length: the recipe's (the DAPO overlong buffer needs more than verl's default)
        overrides = [f"actor_rollout_ref.model.path={tokenizer_dir}", "data.max_response_length=3072"]
        return compose("grace_dapo", overrides=overrides)


def scores(config, tokenizer, rows: list[dict]) -> list[float]:
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from verl_evidence.eval.scoring import build_reward_dataproto

    worker = RewardLoopWorker(config)
    out = []
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        response = f"<evidence>{truth['evidence'][0]}</evidence>\n<answer>{truth['target'][0]}</answer>"
        fields = {k: v for k, v in row.items() if k not in ("input_ids", "attention_mask", "position_ids")}
        data = build_reward_dataproto(
            tokenizer.encode("prompt"), tokenizer.encode(response), fields, extra_fields={}, num_turns=2
        )
        out.append(float(run(worker.compute_score(data))["reward_score"]))
    return out


def test_the_recipes_select_the_phase_manager(tokenizer_dir) -> None:
    from verl.utils.import_utils import load_class_from_fqn

    from verl_evidence.reward_managers.phase import MANAGER_CLASS, PhaseAgentLoopManager

    config = grace_dapo_config(tokenizer_dir)
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == PHASE_MANAGER == MANAGER_CLASS
    assert load_class_from_fqn(PHASE_MANAGER, "AgentLoopManager") is PhaseAgentLoopManager
    for preset in (REPO / "recipes" / "presets" / "rollout_preset").glob("*.yaml"):
        assert f"agent_loop_manager_class: {PHASE_MANAGER}" in preset.read_text(), preset
    # the phase is written before verl's own dispatch
    source = inspect.getsource(PhaseAgentLoopManager.generate_sequences)
    assert source.index("mark_phase_tensordict(prompts)") < source.index("super().generate_sequences(prompts)")


@pytest.mark.parametrize("manager", ["dapo", "grace"])
def test_validation_phase_scores_a_default_built_file_with_alpha_beta_one(
    default_grace_file, tokenizer_dir, tokenizer, manager
) -> None:
    from verl_evidence.dataprep.rows import read_parquet
    from verl_evidence.reward_managers.phase import mark_phase_tensordict

    written = read_parquet(default_grace_file)
    assert {row["extra_info"]["split"] for row in written} == {"train"}  # the default: no column says "validation"
    assert not any(row["extra_info"]["validate"] for row in written)
    config = grace_dapo_config(tokenizer_dir)
    if manager == "grace":
        config.reward.reward_manager.name = "grace"
        config.reward.reward_kwargs = {"alpha": 2.0, "beta": 3.0}
    results = {}
    for validate in (True, False):
        batch = trainer_batch(default_grace_file, tokenizer_dir, validate)
        mark_phase_tensordict(batch)
        rows = dispatched_rows(batch)
        assert all(row["extra_info"]["trainer_phase"] == ("validation" if validate else "train") for row in rows)
        results[validate] = scores(config, tokenizer, rows)
    # gold evidence and gold answer: ROUGE-L 1 on both, so 0.5 + 1 + alpha + beta
    assert results[True] == pytest.approx([3.5, 3.5])  # alpha = beta = 1
    assert results[False] == pytest.approx([6.5, 6.5])  # alpha = 2, beta = 3


def test_the_phase_wins_over_the_rows_own_flag() -> None:
    """A validation file used for training scores with training weights, and the other way round."""
    from verl_evidence.reward_managers.phase import with_phase
    from verl_evidence.rewards import grace

    response = "<evidence>Paris is the capital of France.</evidence><answer>Paris</answer>"
    truth = {"target": ["Paris"], "evidence": ["Paris is the capital of France."], "answerable": True}
    row = {"split": "test", "validate": True, "index": 4}
    trained = with_phase(row, validate=False)
    assert row == {"split": "test", "validate": True, "index": 4}  # the shared row dict is not touched
    assert grace.compute_score("x", response, truth, trained)["score"] == pytest.approx(6.5)
    validated = with_phase({"split": "train", "validate": False}, validate=True)
    assert grace.compute_score("x", response, truth, validated)["score"] == pytest.approx(3.5)
    assert with_phase(None, validate=True) == {"trainer_phase": "validation", "validate": True}


def test_legacy_trainer_batches_are_marked_too() -> None:
    import numpy as np
    import torch
    from verl import DataProto

    from verl_evidence.reward_managers.phase import mark_phase_dataproto

    extra = np.empty(2, dtype=object)
    extra[0], extra[1] = {"split": "train"}, {"split": "train"}
    batch = DataProto.from_dict(tensors={"input_ids": torch.zeros(2, 3)}, non_tensors={"extra_info": extra})
    batch.meta_info["validate"] = True
    mark_phase_dataproto(batch)
    assert [e["trainer_phase"] for e in batch.non_tensor_batch["extra_info"]] == ["validation", "validation"]
    assert extra[0] == {"split": "train"}


def test_evaluation_scores_a_train_split_row_as_validation() -> None:
    """`verl-evidence eval` is validation: a row built with the default --split train still scores alpha = beta = 1,
    and the row it was given is not touched."""
    from verl_evidence.eval.runner import loop_kwargs_from_row, validation_row
    from verl_evidence.rewards import grace

    response = "<evidence>Paris is the capital of France.</evidence><answer>Paris</answer>"
    truth = {"target": ["Paris"], "evidence": ["Paris is the capital of France."], "answerable": True}
    row = {"prompt": [{"role": "user", "content": "q"}], "extra_info": {"split": "train", "index": 3}}
    marked = validation_row(row)
    assert row["extra_info"] == {"split": "train", "index": 3}
    assert grace.compute_score("x", response, truth, marked["extra_info"])["score"] == pytest.approx(3.5)
    assert loop_kwargs_from_row(marked)["extra_info"]["trainer_phase"] == "validation"
