"""What identifies an encoder: its checkpoint's fingerprint, its weights' stamp, its manifest section."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from retrieval_server.config import EncoderConfig


def model_fingerprint(model: str) -> str:
    """Identity of a local checkpoint (config + weight files' names and sizes); the name itself for hub ids."""
    path = Path(model)
    if not path.is_dir():
        return f"name:{model}"
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*")):
        if file.is_file() and (file.suffix in {".json", ".safetensors", ".bin", ".txt"}):
            rel = file.relative_to(path).as_posix()
            if rel.startswith(".") or rel == "README.md":
                continue
            digest.update(rel.encode())
            if file.suffix == ".json" or file.name == "vocab.txt":
                digest.update(file.read_bytes())
            else:
                digest.update(str(file.stat().st_size).encode())
    return f"sha256:{digest.hexdigest()[:32]}"


def weights_stamp(model: str) -> list[list]:
    """Name, size and modification time of a local checkpoint's weight files.

    The model fingerprint reads weight sizes only, and weights retrained in place keep their sizes: an
    export keyed on the fingerprint alone would silently serve the old model. A copied checkpoint gets new
    times, which costs one more export, never a wrong one.
    """
    path = Path(model)
    if not path.is_dir():
        return []
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in {".safetensors", ".bin", ".pt", ".onnx"})
    return [[f.relative_to(path).as_posix(), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def describe(config: EncoderConfig, dim: int) -> dict:
    """The encoder section of a manifest."""
    return {**json.loads(config.model_dump_json()), "dim": dim, "fingerprint": model_fingerprint(config.model)}


# ---------------------------------------------------------------- the encoder's files, hashed whole
# Whole files, not the index files' sampled blocks: a loader reads every byte of them anyway (weights into memory), so
# the hash costs one more read of a file already in the page cache (~25 ms for MiniLM's 87 MiB), and a change anywhere
# in them (word-embedding rows shuffled) changes every answer.
ENCODER_CHECKSUM = "xxh3_128 of every byte"
# What a model directory's loader reads: weights, configs, tokenizer files (not README, not hidden files, not the
# .onnx variants some hub repositories ship: our own export is checked on its own).
MODEL_FILE_SUFFIXES = frozenset({".json", ".safetensors", ".bin", ".pt", ".txt", ".model"})
EXPORT_META = "export.json"  # holds the export's own record of its files ("files"), written once it matched torch
INT8_RECORD = "model.int8.json"  # the int8 graph's record, written when it is quantised (export.json stays as linked)


def full_checksum(path: Path) -> dict:
    """``{"size", "xxh3_128"}`` of every byte of ``path``."""
    import xxhash

    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
        size = handle.tell()
    return {"size": size, "xxh3_128": digest.hexdigest()}


def checksum_files(directory: Path, names: list[str]) -> dict[str, dict]:
    return {name: full_checksum(Path(directory) / name) for name in names}


def model_files(model: str) -> list[str] | None:
    """The files of a local model directory its loader reads, relative to it; None for a hub name."""
    path = Path(model)
    if not path.is_dir():
        return None
    names = []
    for file in path.rglob("*"):
        rel = file.relative_to(path)
        if file.is_file() and file.suffix in MODEL_FILE_SUFFIXES and not any(p.startswith(".") for p in rel.parts):
            names.append(rel.as_posix())
    return sorted(names)


def export_files(export_dir: Path, own_record: bool = False) -> list[str]:
    """The files of an ONNX export, relative to it; ``own_record``: those its own record covers (not the records)."""
    names = []
    for file in Path(export_dir).rglob("*"):
        rel = file.relative_to(export_dir)
        if not file.is_file() or any(p.startswith(".") or p.endswith((".lock", ".partial")) for p in rel.parts):
            continue
        if own_record and rel.as_posix() in (EXPORT_META, INT8_RECORD):
            continue
        names.append(rel.as_posix())
    return sorted(names)


def export_own_record(export_dir: Path) -> dict[str, dict] | None:
    """What the export recorded of its files when it was made (and quantised); None for an export without a record."""
    try:
        files = json.loads((Path(export_dir) / EXPORT_META).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(files, dict):
        return None
    int8 = Path(export_dir) / INT8_RECORD
    if int8.is_file() and (Path(export_dir) / "model.int8.onnx").is_file():
        try:
            files = {**files, "model.int8.onnx": json.loads(int8.read_text())}
        except (OSError, ValueError):
            return None
    return files


def file_problems(directory: Path, recorded: dict[str, dict], present: list[str], recorded_in: Path) -> list[str]:
    """Each file of ``directory`` that ``recorded`` does not describe byte for byte (missing, extra, altered)."""
    problems = []
    for name in sorted(set(recorded) | set(present)):
        path = Path(directory) / name
        said = recorded.get(name)
        if not isinstance(said, dict):
            problems.append(f"{path} is not among the files {recorded_in} records")
        elif not path.is_file():
            problems.append(f"{path} recorded in {recorded_in} is missing")
        else:
            now = full_checksum(path)
            if now["size"] != said.get("size"):
                problems.append(f"{path} is {now['size']} bytes, {recorded_in} recorded {said.get('size')}: altered")
            elif now["xxh3_128"] != said.get("xxh3_128"):
                problems.append(f"{path} is not the file {recorded_in} recorded (same size, other bytes): altered")
    return problems


def export_problems(
    export_dir: Path, recorded: dict[str, dict] | None = None, recorded_in: Path | None = None
) -> list[str]:
    """How an ONNX export differs from ``recorded`` (an index manifest's record of it, every file), or without one
    from its own record; an export without a record of its own is a problem too (removing it makes a new one)."""
    export_dir = Path(export_dir)
    if recorded is not None:
        present = export_files(export_dir)
        # An int8 graph quantised after the index recorded its export (another index or a test asked for it) is
        # vouched for by the export's own record, checked byte for byte like the rest; its record file is not a model.
        own = export_own_record(export_dir) or {}
        later = {n: own[n] for n in present if n not in recorded and n in own}
        if "model.int8.onnx" in later and INT8_RECORD not in recorded:
            present = [n for n in present if n != INT8_RECORD]
        return file_problems(export_dir, {**recorded, **later}, present, recorded_in)
    own = export_own_record(export_dir)
    if own is None:
        return [f"{export_dir / EXPORT_META} records no checksums of the export's files"]
    return file_problems(export_dir, own, export_files(export_dir, own_record=True), export_dir / EXPORT_META)
