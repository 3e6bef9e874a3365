"""Sentence encoders described by an :class:`EncoderConfig` (E5, BGE, any sentence-transformers model).

The pooling is built explicitly from the config (rather than trusting whatever a
checkpoint ships with) so that the manifest's description *is* the computation.

Two backends compute the same vectors: :class:`SentenceEncoder` (torch, the GPU
path and the reference; :mod:`.torch_encoder`) and :class:`OnnxEncoder` (ONNX
Runtime for CPU replicas; :mod:`.onnx_runtime`): the torch model exported once by
:mod:`.onnx_export`, with its pooling and normalisation inside the graph, refused
unless it matches torch to :data:`ONNX_TOLERANCE`. :mod:`.fingerprint` says which
checkpoint an index or an export was made with. :func:`load_query_encoder` picks a
server replica's backend.
"""

from __future__ import annotations

import logging
from pathlib import Path

from retrieval_server.config import EncoderConfig
from retrieval_server.encoders.fingerprint import describe, model_fingerprint, weights_stamp
from retrieval_server.encoders.onnx_export import (
    ONNX_EXPORT_FORMAT,
    ONNX_OPSET,
    ONNX_TOLERANCE,
    PROBE_TEXTS,
    ensure_onnx_export,
    export_onnx,
    export_onnx_in_subprocess,
    max_abs_difference,
    onnx_cache_key,
    onnx_export_dir,
    quantize_onnx,
)
from retrieval_server.encoders.onnx_runtime import (
    MIN_QUERIES_PER_THREAD,
    ONNX_OUTPUT,
    RUN_OVERHEAD_TOKENS,
    OnnxEncoder,
    OnnxExportError,
    TokenizerJson,
    load_export_tokenizer,
    plan_runs,
)
from retrieval_server.encoders.torch_encoder import SentenceEncoder, resolve_device

logger = logging.getLogger(__name__)

__all__ = [
    "MIN_QUERIES_PER_THREAD",
    "ONNX_EXPORT_FORMAT",
    "ONNX_OPSET",
    "ONNX_OUTPUT",
    "ONNX_TOLERANCE",
    "PROBE_TEXTS",
    "RUN_OVERHEAD_TOKENS",
    "OnnxEncoder",
    "OnnxExportError",
    "SentenceEncoder",
    "TokenizerJson",
    "describe",
    "ensure_onnx_export",
    "export_onnx",
    "export_onnx_in_subprocess",
    "load_export_tokenizer",
    "load_query_encoder",
    "max_abs_difference",
    "model_fingerprint",
    "onnx_cache_key",
    "onnx_export_dir",
    "plan_runs",
    "prepare_query_encoder",
    "quantize_onnx",
    "resolve_device",
    "weights_stamp",
]


def _require_onnxruntime() -> None:
    # Checked before anything is exported: without it the export could not even be verified.
    try:
        import onnxruntime  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "the onnx encoder backends need onnxruntime: pip install onnxruntime onnx (both in verl-evidence[serve])"
        ) from err


def load_query_encoder(
    config: EncoderConfig,
    backend: str = "torch",
    device: str | None = None,
    index_dir: Path | None = None,
    threads: int = 1,
) -> SentenceEncoder | OnnxEncoder:
    """The query encoder of a server replica.

    ``backend``: torch | onnx | onnx-int8 | auto (onnx on CPU, torch on GPU).
    """
    on_cpu = resolve_device(device) == "cpu"
    if backend == "auto":
        if not on_cpu:
            return SentenceEncoder(config, device=device)
        try:
            _require_onnxruntime()
            return OnnxEncoder(ensure_onnx_export(config, index_dir), config, threads=threads)
        except (ImportError, OnnxExportError) as err:  # onnxruntime not installed, or a model it cannot export
            logger.warning("ONNX encoder unavailable (%s); using torch", err)
            return SentenceEncoder(config, device=device)
    if backend == "torch":
        return SentenceEncoder(config, device=device)
    if backend not in ("onnx", "onnx-int8"):
        raise ValueError(f"unknown encoder backend {backend!r}: torch, onnx, onnx-int8 or auto")
    if not on_cpu:
        raise ValueError(
            f"encoder backend {backend!r} runs on CPU, but device is {resolve_device(device)!r}; torch is the GPU path"
        )
    _require_onnxruntime()
    quantized = backend == "onnx-int8"
    return OnnxEncoder(ensure_onnx_export(config, index_dir, quantized), config, quantized=quantized, threads=threads)


def replica_backend(backend: str, device: str | None, num_gpus: float) -> str:
    """The backend a replica will run, decided by the process that starts it: ``auto`` is ONNX on a CPU replica.

    A replica reserving no GPU runs on CPU (Ray hides the GPUs from it) unless ``device`` says otherwise.
    """
    if backend != "auto":
        return backend
    on_cpu = resolve_device(device) == "cpu" if device else num_gpus == 0
    return "onnx" if on_cpu else "torch"


def prepare_query_encoder(
    config: EncoderConfig, backend: str, device: str | None, num_gpus: float, index_dir: Path | None
) -> tuple[Path, bool] | None:
    """Make the ONNX export the replicas will load, before any starts (``serve``'s own process, via a subprocess);
    its directory and whether it was made (or linked, or given its int8 graph) just now, or None when the replicas
    run torch.

    Replicas starting together would otherwise wait for one of them to export, inside Serve's start-up deadline.
    ``auto`` on a model that cannot be exported (or without onnxruntime) warns: its replicas use torch.
    """
    backend_to_run = replica_backend(backend, device, num_gpus)
    if backend_to_run not in ("onnx", "onnx-int8"):
        return None
    quantized = backend_to_run == "onnx-int8"
    try:
        _require_onnxruntime()
        needed = onnx_export_dir(config, index_dir, quantized) / ("model.int8.onnx" if quantized else "export.json")
        existed = needed.exists()
        return ensure_onnx_export(config, index_dir, quantized=quantized), not existed
    except (ImportError, OnnxExportError) as err:
        if backend != "auto":
            raise
        logger.warning("ONNX encoder unavailable (%s); replicas will use torch", err)
        return None
