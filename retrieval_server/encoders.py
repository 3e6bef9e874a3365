"""Sentence encoders described by an :class:`EncoderConfig` (E5, BGE, any sentence-transformers model).

The pooling is built explicitly from the config (rather than trusting whatever a
checkpoint ships with) so that the manifest's description *is* the computation.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from retrieval_server.config import EncoderConfig

logger = logging.getLogger(__name__)


def resolve_device(device: str | None) -> str:
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


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


def _dimension(module) -> int:
    # sentence-transformers 6 renamed the getters; keep working with 3.x-5.x too.
    for getter in ("get_embedding_dimension", "get_sentence_embedding_dimension", "get_word_embedding_dimension"):
        if hasattr(module, getter):
            return int(getattr(module, getter)())
    raise TypeError(f"cannot tell the embedding dimension of {type(module).__name__}")


class SentenceEncoder:
    """Queries and passages to L2-normalised (if configured) float32 vectors."""

    def __init__(self, config: EncoderConfig, device: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer, models

        self.config = config
        self.device = resolve_device(device)
        if config.pooling == "auto":
            self.model = SentenceTransformer(config.model, device=self.device)
            self.model.max_seq_length = config.max_length
            if config.normalize and not any(isinstance(m, models.Normalize) for m in self.model):
                self.model.append(models.Normalize())
        else:
            transformer = models.Transformer(config.model, max_seq_length=config.max_length)
            modules = [transformer, models.Pooling(_dimension(transformer), pooling_mode=config.pooling)]
            if config.normalize:
                modules.append(models.Normalize())
            self.model = SentenceTransformer(modules=modules, device=self.device)
        if self.device.startswith("cuda"):
            self.model.half()  # fp16 on GPU: half the memory, same ranking to ~1e-3
        self.model.eval()
        self.dim = _dimension(self.model)

    def _encode(self, texts: list[str], prefix: str, batch_size: int) -> np.ndarray:
        vectors = self.model.encode(
            [prefix + t for t in texts],
            batch_size=batch_size,
            convert_to_numpy=True,
            show_progress_bar=False,
            normalize_embeddings=False,  # the Normalize module (if configured) already ran
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, queries: list[str], batch_size: int = 128) -> np.ndarray:
        return self._encode(queries, self.config.query_prefix, batch_size)

    def encode_passages(self, passages: list[str], batch_size: int = 64) -> np.ndarray:
        return self._encode(passages, self.config.passage_prefix, batch_size)


def describe(config: EncoderConfig, dim: int) -> dict:
    """The encoder section of a manifest."""
    return {**json.loads(config.model_dump_json()), "dim": dim, "fingerprint": model_fingerprint(config.model)}
