"""recipes/evipath_sft.sh composes with verl 0.9.1's real SFT Hydra config and builds its dataset on CPU."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "evipath_sft.sh"

CHECK = r"""
import json, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
import verl
from verl.trainer.sft_trainer import create_sft_dataset
from verl.utils import hf_tokenizer
from verl.utils.config import omega_conf_to_dataclass

overrides = json.loads(sys.argv[1])
config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
with initialize_config_dir(config_dir=config_dir, version_base=None):
    cfg = compose(config_name="sft_trainer_engine", overrides=overrides)
OmegaConf.resolve(cfg)
# What SFTTrainer._build_config does, then its dataset construction.
model = omega_conf_to_dataclass(cfg.model)
engine = omega_conf_to_dataclass(cfg.engine)
optim = omega_conf_to_dataclass(cfg.optim)
omega_conf_to_dataclass(cfg.checkpoint)
omega_conf_to_dataclass(cfg.profiler)
tokenizer = hf_tokenizer(cfg.model.path)
dataset = create_sft_dataset(cfg.data.train_files, cfg.data, tokenizer, None)
item = dataset[0]
print(json.dumps({
    "config": OmegaConf.to_container(cfg),
    "rows": len(dataset),
    "trained_tokens": int(item["loss_mask"].sum()),
    "optim_lr": optim.lr,
    "scheduler": optim.lr_scheduler_type,
    "model_path": model.path,
}))
"""


def _dry_run(env: dict[str, str], *args: str) -> list[str]:
    result = subprocess.run(
        ["bash", str(RECIPE), "--dry-run", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    command = result.stdout.split("# trainer:\n", 1)[1].replace("\\\n", " ")
    return shlex.split(command)


def _hydra_overrides(argv: list[str]) -> list[str]:
    assert "verl.trainer.sft_trainer" in argv
    return argv[argv.index("verl.trainer.sft_trainer") + 1 :]


def test_defaults_follow_the_paper():
    argv = _dry_run({})
    launcher = argv.index("torch.distributed.run")  # python -m torch.distributed.run: the venv's, even unactivated
    assert argv[launcher - 1] == "-m" and argv[launcher + 1 : launcher + 3] == ["--standalone", "--nnodes=1"]
    overrides = dict(a.split("=", 1) for a in _hydra_overrides(argv))
    assert overrides["optim.lr"] == "2e-6"
    assert overrides["optim.lr_warmup_steps_ratio"] == "0.1"
    assert overrides["trainer.total_epochs"] == "2"
    assert overrides["data.micro_batch_size_per_gpu"] == "2"
    assert overrides["data.train_batch_size"] == str(2 * 8 * 4)
    assert overrides["data.messages_key"] == "messages"


def test_multi_node_launch_needs_its_rendezvous():
    argv = _dry_run({"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"})
    assert "--node_rank=1" in argv and "--master_addr=10.0.0.1" in argv and "--standalone" not in argv
    assert "data.train_batch_size=128" in argv
    failed = subprocess.run(
        ["bash", str(RECIPE), "--dry-run"],
        env={**os.environ, "NNODES": "2"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert failed.returncode != 0 and "NODE_RANK" in failed.stderr


@pytest.mark.slow
@pytest.mark.timeout(420)  # its subprocess has 300 s
def test_recipe_composes_with_verl_sft_config_and_reads_our_parquet(tmp_path):
    from verl_evidence.local.tiny_models import tiny_causal_lm

    model_dir = tmp_path / "tiny"
    tiny_causal_lm(seed=0, directory=model_dir)
    data = tmp_path / "train.parquet"
    _write_one_planner_row(data)
    argv = _dry_run(
        {
            "MODEL_PATH": str(model_dir),
            "TRAIN_FILES": str(data),
            "GPUS_PER_NODE": "1",
            "LR": "1e-5",
            "MAX_LENGTH": "2048",
        },
        "trainer.seed=7",
    )
    overrides = _hydra_overrides(argv)
    result = subprocess.run(
        [sys.executable, "-c", CHECK, __import__("json").dumps(overrides)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = __import__("json").loads(result.stdout.strip().splitlines()[-1])
    config = report["config"]
    assert report["rows"] == 1 and report["trained_tokens"] > 0
    assert report["optim_lr"] == 1e-5 and report["scheduler"] == "cosine"
    assert config["trainer"]["seed"] == 7  # extra args reach Hydra
    assert config["data"]["max_length"] == 2048 and config["trainer"]["n_gpus_per_node"] == 1
    assert config["data"]["train_batch_size"] == 16


def test_unknown_key_is_refused_by_hydra(tmp_path):
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    argv = _dry_run({"MODEL_PATH": "/m"}, "data.no_such_key=1")
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        with pytest.raises(ConfigCompositionException):
            compose(config_name="sft_trainer_engine", overrides=_hydra_overrides(argv))
        cfg = compose(config_name="sft_trainer_engine", overrides=_hydra_overrides(argv)[:-1])
    assert cfg.optim.lr == 2e-6


def _write_one_planner_row(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl_evidence.evipath.writer import SCHEMA

    messages = [
        {"role": "system", "content": "plan and search"},
        {"role": "user", "content": "Question: When was it founded?"},
        {
            "role": "assistant",
            "content": '<think>\nplan\n</think>\n<action>\nSearch("When was HBU founded?")\n</action>',
        },
        {"role": "user", "content": "Observation:\nHBU was founded in 1960."},
        {"role": "assistant", "content": "<think>\nso 1960\n</think>\n<answer> 1960 </answer>"},
    ]
    row = {
        "messages": messages,
        "kind": "planner",
        "id": "x",
        "data_source": "evipath_test",
        "question": "q",
        "answers": ["1960"],
    }
    pq.write_table(pa.Table.from_pylist([row], schema=SCHEMA), path)
