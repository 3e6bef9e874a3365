"""verl checkpoints as policies: find the actor's FSDP shards, merge them once with verl's merger, reuse the result.

A verl run saves ``<default_local_dir>/global_step_N/actor/`` with one
``model_world_size_<W>_rank_<r>.pt`` per training process, ``fsdp_config.json``
(``world_size``) and ``huggingface/`` (config and tokenizer). Evaluating one
needs a Hugging Face model directory, which verl's own model merger
(:class:`verl.model_merger.fsdp_model_merger.FSDPModelMerger`) writes.

Merging a 7B actor takes minutes and ~15 GB, so the result is cached under a key
computed from the identity of the files the merger reads (name, size and
modification time of each shard, ``fsdp_config.json`` and the ``huggingface/``
files, plus verl's version): a second evaluation of the same checkpoint reuses
it, a checkpoint written again (a resumed run that saved the same step anew) is
merged again, replacing its older merge. Hashing the shards' bytes instead would
read 15 GB per evaluation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = [
    "MERGE_RECORD",
    "CheckpointError",
    "MergedCheckpoint",
    "VerlCheckpoint",
    "checkpoint_labels",
    "find_checkpoint",
    "merge_checkpoint",
    "shard_identity",
]

MERGE_RECORD = "verl_evidence_merge.json"  # written last into a merged directory: its presence means complete
_SHARD_NAME = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


class CheckpointError(ValueError):
    """A ``--checkpoint`` that is not a verl FSDP checkpoint; the message names the directory and what is missing."""


@dataclass(frozen=True)
class VerlCheckpoint:
    """A verl ``global_step_N`` directory whose ``actor/`` holds a complete set of FSDP shards."""

    path: Path
    actor_dir: Path
    world_size: int

    @property
    def shard_files(self) -> list[Path]:
        return [self.actor_dir / f"model_world_size_{self.world_size}_rank_{r}.pt" for r in range(self.world_size)]


@dataclass(frozen=True)
class MergedCheckpoint:
    checkpoint: VerlCheckpoint
    model_dir: Path
    key: str
    merged_now: bool  # False: taken from the cache


def find_checkpoint(path: str | Path) -> VerlCheckpoint:
    """The checkpoint at ``path`` (a ``global_step_N`` directory, or its ``actor/``), checked complete.

    Raises :class:`CheckpointError` naming the directory and the first thing missing.
    """
    given = Path(path).expanduser()
    if not given.is_dir():
        raise CheckpointError(f"--checkpoint {given}: no such directory")
    given = given.resolve()
    if (given / "fsdp_config.json").is_file() and not (given / "actor").is_dir():
        step_dir, actor = given.parent, given  # the actor directory itself
    else:
        step_dir, actor = given, given / "actor"
    if not actor.is_dir():
        raise CheckpointError(
            f"--checkpoint {given}: no actor/ directory with FSDP shards (expected a verl global_step_N directory)"
        )
    shards = sorted(p.name for p in actor.iterdir() if _SHARD_NAME.match(p.name))
    if not shards:
        raise CheckpointError(
            f"--checkpoint {given}: no actor FSDP shards (model_world_size_<N>_rank_<r>.pt) in {actor}"
        )
    config_path = actor / "fsdp_config.json"
    if not config_path.is_file():
        raise CheckpointError(f"--checkpoint {given}: {config_path.name} (the shards' world size) missing in {actor}")
    try:
        world_size = int(json.loads(config_path.read_text(encoding="utf-8"))["world_size"])
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"--checkpoint {given}: {config_path} has no readable world_size ({err})") from err
    checkpoint = VerlCheckpoint(path=step_dir, actor_dir=actor, world_size=world_size)
    missing = [p.name for p in checkpoint.shard_files if not p.is_file()]
    if missing:
        raise CheckpointError(
            f"--checkpoint {given}: actor shards of world size {world_size} incomplete, missing {', '.join(missing)}"
        )
    if not (actor / "huggingface" / "config.json").is_file():
        raise CheckpointError(
            f"--checkpoint {given}: actor/huggingface/config.json missing (verl saves the model config there)"
        )
    return checkpoint


def _identity_files(checkpoint: VerlCheckpoint) -> list[Path]:
    hf_dir = checkpoint.actor_dir / "huggingface"
    hf_files = sorted(p for p in hf_dir.rglob("*") if p.is_file())
    return [*checkpoint.shard_files, checkpoint.actor_dir / "fsdp_config.json", *hf_files]


def shard_identity(checkpoint: VerlCheckpoint) -> str:
    """Hex key of what the merger reads: each file's path within ``actor/``, size and mtime; and verl's version."""
    from importlib.metadata import version

    digest = hashlib.sha256(f"verl {version('verl')}\n".encode())
    for path in _identity_files(checkpoint):
        stat = path.stat()
        relative = path.relative_to(checkpoint.actor_dir).as_posix()
        digest.update(f"{relative}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _run_verl_merger(actor_dir: Path, target_dir: Path) -> None:
    """verl's FSDP merger, in this process (its Python API, as ``python -m verl.model_merger merge`` calls it)."""
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    config = ModelMergerConfig(
        operation="merge",
        backend="fsdp",
        local_dir=str(actor_dir),
        target_dir=str(target_dir),
        hf_model_config_path=str(actor_dir / "huggingface"),
    )
    merger = FSDPModelMerger(config)
    try:
        merger.merge_and_save()  # ends with verl's own check that the output is a complete HF model
    finally:
        merger.cleanup()


def merge_checkpoint(checkpoint: VerlCheckpoint, cache_dir: str | Path) -> MergedCheckpoint:
    """The merged HF model directory of ``checkpoint`` under ``cache_dir``: reused if cached, else merged now.

    Concurrent evaluations of one checkpoint merge it once (a file lock per key);
    the merge is written to a temporary directory and renamed into place with its
    record last, so an interrupted merge is never mistaken for a finished one.
    """
    from filelock import FileLock

    cache = Path(cache_dir).expanduser().resolve()
    cache.mkdir(parents=True, exist_ok=True)
    key = shard_identity(checkpoint)
    target = cache / f"{checkpoint.path.name}-{key}"
    if (target / MERGE_RECORD).is_file():
        return MergedCheckpoint(checkpoint, target, key, merged_now=False)
    with FileLock(str(cache / f".{target.name}.lock")):
        if (target / MERGE_RECORD).is_file():  # another process merged it while we waited
            return MergedCheckpoint(checkpoint, target, key, merged_now=False)
        partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        logger.info("merging %s with verl's FSDP model merger into %s", checkpoint.actor_dir, target)
        try:
            _run_verl_merger(checkpoint.actor_dir, partial)
            record = {
                "checkpoint": str(checkpoint.path),
                "actor_dir": str(checkpoint.actor_dir),
                "world_size": checkpoint.world_size,
                "key": key,
                "files": [
                    {
                        "path": p.relative_to(checkpoint.actor_dir).as_posix(),
                        "size": p.stat().st_size,
                        "mtime_ns": p.stat().st_mtime_ns,
                    }
                    for p in _identity_files(checkpoint)
                ],
            }
            (partial / MERGE_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            shutil.rmtree(target, ignore_errors=True)  # without a merge record it is not a finished merge
            os.replace(partial, target)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        _remove_superseded_merges(cache, checkpoint, key)
    return MergedCheckpoint(checkpoint, target, key, merged_now=True)


def _remove_superseded_merges(cache: Path, checkpoint: VerlCheckpoint, key: str) -> None:
    """Older merges of this checkpoint directory: their weights exist nowhere else any more, and a 7B one is 15 GB."""
    for merged in cache.glob(f"{checkpoint.path.name}-*"):
        record_path = merged / MERGE_RECORD
        if not record_path.is_file():
            continue
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if record.get("checkpoint") == str(checkpoint.path) and record.get("key") != key:
            logger.info("removing %s: merged from an earlier state of %s", merged, checkpoint.path)
            shutil.rmtree(merged, ignore_errors=True)


def checkpoint_labels(paths: list[Path]) -> list[str]:
    """Row labels: each checkpoint's directory name, with as many parent names as it takes to tell them apart."""
    parts = [p.parts for p in paths]
    for depth in range(1, max((len(p) for p in parts), default=1) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]
