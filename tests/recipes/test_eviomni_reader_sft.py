"""recipes/eviomni_reader_sft.sh: EviOmni's QA generator, LoRA rank 8 with verl's SFT trainer, on (q, P) -> a rows."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

from recipe_commands import dry_run


def printed_commands(stdout: str) -> tuple[list[str], list[str]]:
    """(the reader-data command, the trainer command) as a shell would parse them."""
    data_part, trainer_part = stdout.split("# trainer:\n")
    data = shlex.split(data_part.split("exists):\n", 1)[1].replace("\\\n", " "))
    return data, shlex.split(trainer_part.replace("\\\n", " "))


def overrides(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("-"))


def test_the_dry_run_builds_reader_rows_then_trains_lora_rank_8() -> None:
    result = dry_run("eviomni_reader_sft.sh")
    assert result.returncode == 0, result.stderr
    data, trainer = printed_commands(result.stdout)
    assert data[:3] == ["python", "-m", "verl_evidence.eval.paper_reader_data"]
    assert data[data.index("--prompt") + 1] == "eviomni_reader" and "--rows" in data
    assert "verl.trainer.sft_trainer" in trainer
    values = overrides(trainer)
    assert values["model.lora_rank"] == "8"  # the papers' rank
    assert values["data.train_files"] == data[data.index("--out") + 1]
    assert values["model.path"] == "Qwen/Qwen2.5-1.5B-Instruct" and values["data.messages_key"] == "messages"


def test_the_zero_baselines_reader_and_environment_overrides() -> None:
    result = dry_run(
        "eviomni_reader_sft.sh", "trainer.total_epochs=3", READER_PROMPT="eviomni_closed_book", LORA_RANK="16"
    )
    data, trainer = printed_commands(result.stdout)
    assert data[data.index("--prompt") + 1] == "eviomni_closed_book"
    assert overrides(trainer)["model.lora_rank"] == "16" and trainer[-1] == "trainer.total_epochs=3"


def test_the_trainer_overrides_compose_with_verls_sft_config() -> None:
    """Every key the recipe sets exists in verl 0.9.1's sft_trainer_engine config (a typo would fail the run)."""
    from hydra import compose, initialize_config_dir

    _, trainer = printed_commands(dry_run("eviomni_reader_sft.sh").stdout)
    config_dir = Path(importlib.util.find_spec("verl").submodule_search_locations[0]) / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(
            config_name="sft_trainer_engine", overrides=[a for a in trainer if "=" in a and "." in a.split("=")[0]]
        )
    assert cfg.model.lora_rank == 8 and cfg.model.target_modules == "all-linear" and cfg.data.truncation == "error"
