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
