"""The torch backend: :class:`SentenceEncoder`, the GPU path and the reference every other backend is held to."""

from __future__ import annotations

import glob
import os

import numpy as np

from retrieval_server.config import EncoderConfig

# Device files a GPU runtime creates (NVIDIA's driver, AMD's ROCm, WSL's GPU): without any of them no accelerator is
# visible. Patterns: a container may be given /dev/nvidia3 alone.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia[0-9]*", "/proc/driver/nvidia/version", "/dev/kfd", "/dev/dxg")


def resolve_device(device: str | None) -> str:
    """``device``, else cuda where torch sees a GPU, else cpu.

    Without a GPU device file the answer is cpu without importing torch: a CPU replica on the ONNX backend then
    never loads torch (~1.5 CPU-s of its start).
    """
    if device:
        return device
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1") or not any(map(glob.glob, GPU_DEVICE_FILES)):
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _dimension(module) -> int:
    # sentence-transformers 6 renamed the getters; keep working with 3.x-5.x too.
    for getter in ("get_embedding_dimension", "get_sentence_embedding_dimension", "get_word_embedding_dimension"):
        if hasattr(module, getter):
            return int(getattr(module, getter)())
    raise TypeError(f"cannot tell the embedding dimension of {type(module).__name__}")


class SentenceEncoder:
    """Queries and passages to L2-normalised (if configured) float32 vectors."""

    backend = "torch"

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
