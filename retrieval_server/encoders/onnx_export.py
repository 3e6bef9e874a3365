"""Exporting the torch encoder to ONNX (pooling and normalisation inside the graph), checked against torch to
:data:`ONNX_TOLERANCE` before it is cached, and its optional int8 quantisation."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from filelock import FileLock

from retrieval_server.config import EncoderConfig, cache_dir
from retrieval_server.encoders.fingerprint import (
    INT8_RECORD,
    checksum_files,
    export_files,
    export_problems,
    full_checksum,
    model_fingerprint,
    weights_stamp,
)
from retrieval_server.encoders.onnx_runtime import ONNX_OUTPUT, OnnxEncoder, OnnxExportError
from retrieval_server.encoders.torch_encoder import SentenceEncoder
from retrieval_server.errors import IndexMismatchError

logger = logging.getLogger(__name__)

ONNX_TOLERANCE = 1e-4  # largest |torch - onnx| allowed in any coordinate of any probe vector
# Part of the cache key: bump it when the export changes, and old caches are not reused. 2: export.json records the
# checksums of the export's files.
ONNX_EXPORT_FORMAT = 2
ONNX_OPSET = 17
# What an export is checked on: a padded batch of mixed lengths and each text alone (padding and sequence length
# are what a trace can freeze), a text past max_length (truncation), non-ASCII text and the empty string.
PROBE_TEXTS = (
    "who wrote on the origin of species",
    "what is the boiling point of water at sea level in degrees fahrenheit?",
    "Paris",
    "Ünïcödé naïve café, 東京 and Zürich: are they tokenised alike?",
    "",
    "evidence " * 400,
    "The Treaty of Westphalia (1648) ended the Thirty Years' War; which powers signed it, and what did it decide?",
)


def onnx_cache_key(config: EncoderConfig) -> str:
    """Everything the exported graph depends on. Prefixes are applied to the text, so they are not part of it."""
    identity = {
        "format": ONNX_EXPORT_FORMAT,
        "fingerprint": model_fingerprint(config.model),
        "weights": weights_stamp(config.model),
        "pooling": config.pooling,
        "normalize": config.normalize,
        "max_length": config.max_length,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK)


def onnx_export_dir(config: EncoderConfig, index_dir: Path | None, quantized: bool = False) -> Path:
    """``<index_dir>/encoders/onnx-<key>`` (beside the index) when it holds the export or can be given it,
    else the same under the user cache.

    Beside the index, replicas on other nodes reading the same index directory find it there.
    """
    name = f"onnx-{onnx_cache_key(config)}"
    needed = "model.int8.onnx" if quantized else "export.json"
    if index_dir is not None:
        beside = Path(index_dir) / "encoders" / name
        if (beside / needed).exists() or _writable(beside.parent):
            return beside
    cached = cache_dir() / "encoders" / name
    if (cached / needed).exists() or _writable(cached.parent):
        return cached
    tried = [str(Path(index_dir) / "encoders")] if index_dir is not None else []
    raise OnnxExportError(
        f"no writable directory for the ONNX export of {config.model}: tried {', '.join([*tried, str(cached.parent)])}"
    )


def ensure_onnx_export(config: EncoderConfig, index_dir: Path | None, quantized: bool = False) -> Path:
    """The directory of this encoder's ONNX export (``model.onnx``, tokenizer, ``export.json``), made if missing.

    An export is made once per machine: it is also published to the user cache, and an index directory without one
    gets the cached files linked in (no second export, no second copy on disk), so every index built with the same
    encoder starts its replicas without exporting again.

    Links, not copies, and every use checked: a file changed in one place is changed in every index that links it,
    and each of them refuses it (the export's own record, written when it matched torch, and the index manifest's).
    Copies would only confine a change to one index while costing a copy of the weights per index; the check is
    needed either way, since a copy can be changed too.
    """
    target = onnx_export_dir(config, index_dir, quantized)
    needed = "model.int8.onnx" if quantized else "export.json"
    cached = cache_dir() / "encoders" / target.name
    if not (target / needed).exists():
        with FileLock(target.parent / f".{target.name}.lock"):  # one exporter at a time: replicas start together
            if target != cached and (cached / "export.json").exists():
                _refuse_altered(cached)  # never lend an altered export to another index
                _publish(cached, target)  # what the cache holds; an int8 graph it lacks is made below
            if not (target / "export.json").exists():  # another replica may have made it while we waited
                make_export(config, target)
            if quantized and not (target / "model.int8.onnx").exists():
                quantize_onnx(target)
    _refuse_altered(target)
    if target != cached and not (cached / needed).exists():
        _publish(target, cached)
    return target


def _refuse_altered(export_dir: Path) -> None:
    """Raise (one line naming the files) unless the export's files are those it recorded when it was made: its files
    are hard-linked between the user cache and every index given them, so one changed file reaches all of those."""
    problems = export_problems(export_dir)
    if problems:
        raise IndexMismatchError(f"refusing the ONNX export {export_dir}: " + "; ".join(problems))


def _publish(source: Path, destination: Path) -> None:
    """Hard-link (copy across file systems) an export directory to ``destination``: a new directory appears whole,
    by one rename; an existing (whole) one only gains the files it lacks, such as the int8 graph.

    Best effort: a read-only or full disk costs the next index an export, nothing else.
    """
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(destination.parent / f".{destination.name}.publish.lock"):
            work = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent))
            try:
                shutil.copytree(source, work, dirs_exist_ok=True, copy_function=_link_or_copy)
                if not destination.exists():
                    os.replace(work, destination)
                    return
                for path in work.rglob("*"):
                    final = destination / path.relative_to(work)
                    if path.is_file() and not final.exists():
                        final.parent.mkdir(parents=True, exist_ok=True)
                        os.replace(path, final)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as err:
        logger.warning("could not share the ONNX export %s at %s: %s", source, destination, err)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # another file system
        shutil.copy2(source, destination)


def export_onnx(config: EncoderConfig, target: Path) -> dict:
    """Export the torch encoder (transformer, pooling, normalisation: one graph) and check it against torch.

    TorchScript exporter (``dynamo=False``) with dynamic batch and sequence axes, traced on a padded batch:
    it needs no extra package, and its graph ran faster in ONNX Runtime here than the dynamo exporter's
    (both matched torch to ~2e-7). Written to a temporary directory and renamed into place only after
    every probe text matches torch within ONNX_TOLERANCE, so a bad export is never cached.
    """
    import torch

    started = time.perf_counter()
    reference = SentenceEncoder(config, device="cpu")  # fp32: the vectors the index was built with
    model = reference.model
    tokenize = model.preprocess if hasattr(model, "preprocess") else model.tokenize  # sentence-transformers 6 / 3-5
    example = tokenize([config.query_prefix + t for t in PROBE_TEXTS[:4]])  # mixed lengths: the mask is traced too
    names = [name for name, value in example.items() if isinstance(value, torch.Tensor)]

    class SentenceGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.model(dict(zip(names, inputs)))["sentence_embedding"]

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer and deprecation chatter: the numeric check below is what counts
            try:
                torch.onnx.export(
                    SentenceGraph().eval(), tuple(example[n] for n in names), str(work / "model.onnx"), dynamo=False,
                    input_names=names, output_names=[ONNX_OUTPUT], opset_version=ONNX_OPSET,
                    dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in names}, ONNX_OUTPUT: {0: "batch"}},
                )  # fmt: skip
            except Exception as err:
                raise OnnxExportError(
                    f"cannot export {config.model} to ONNX ({type(err).__name__}: {err}); "
                    "serve it with encoder_backend='torch'"
                ) from err
        model.tokenizer.save_pretrained(str(work / "tokenizer"))
        meta = {
            "format": ONNX_EXPORT_FORMAT,
            "model": config.model,
            "fingerprint": model_fingerprint(config.model),
            "pooling": config.pooling,
            "normalize": config.normalize,
            "max_length": config.max_length,
            # What sentence-transformers truncates at (capped by the model).
            "max_seq_length": int(model.max_seq_length),
            "dim": reference.dim,
            "inputs": names,
            "opset": ONNX_OPSET,
            "versions": _versions(),
        }
        (work / "export.json").write_text(json.dumps(meta, indent=2))
        diff = max_abs_difference(reference, OnnxEncoder(work, config), PROBE_TEXTS)
        if not diff <= ONNX_TOLERANCE:
            raise OnnxExportError(
                f"ONNX export of {config.model} differs from torch by up to {diff:.2e} (> {ONNX_TOLERANCE:g}) on the "
                "probe texts; not cached. Serve it with encoder_backend='torch'"
            )
        meta.update(max_abs_diff_vs_torch=diff, export_seconds=round(time.perf_counter() - started, 2))
        # The files as they matched torch: every later use is checked against this (fingerprint.export_problems).
        meta["files"] = checksum_files(work, export_files(work, own_record=True))
        (work / "export.json").write_text(json.dumps(meta, indent=2))
        os.replace(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    seconds = meta["export_seconds"]
    logger.info("exported %s to ONNX at %s in %.1f s (max |torch - onnx| %.1e)", config.model, target, seconds, diff)
    return meta


def make_export(config: EncoderConfig, target: Path) -> None:
    """Export here when this process already holds torch (nothing to spare it), else in a subprocess."""
    if "torch" in sys.modules:
        export_onnx(config, target)
    else:
        export_onnx_in_subprocess(config, target)


# The last stderr line of a child whose export was refused: the message to raise in the parent.
_REFUSED = "onnx export refused: "


def export_onnx_in_subprocess(config: EncoderConfig, target: Path) -> None:
    """:func:`export_onnx` in a child interpreter. The exporter needs torch, and the processes that ask for an
    export (``serve`` before it starts Serve, a CPU replica on a machine without one) must not import it: torch
    would stay loaded for their whole life (~1.5 CPU-s of a replica's start, hundreds of MB), while the child
    gives it all back when it exits. Raises :class:`OnnxExportError` with the child's reason."""
    script = "import sys; from retrieval_server.encoders.onnx_export import _export_main; _export_main(*sys.argv[1:])"
    # The child imports what this process imports, whatever started it (a Ray worker's path, a test's checkout).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(entry for entry in sys.path if entry)}
    logger.info("exporting %s to ONNX at %s (in a subprocess, once per machine)", config.model, target)
    result = subprocess.run(
        [sys.executable, "-c", script, config.model_dump_json(), str(target)], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        refused = next((line.removeprefix(_REFUSED) for line in reversed(lines) if line.startswith(_REFUSED)), None)
        raise OnnxExportError(
            refused
            or f"exporting {config.model} to ONNX failed in its subprocess (exit {result.returncode}): "
            f"{lines[-1] if lines else 'no output'}; serve it with encoder_backend='torch'"
        )
    meta = json.loads((target / "export.json").read_text())
    logger.info(
        "exported %s to ONNX in %.1f s (max |torch - onnx| %.1e)",
        config.model,
        meta["export_seconds"],
        meta["max_abs_diff_vs_torch"],
    )


def _export_main(config_json: str, target: str) -> None:
    """The child of :func:`export_onnx_in_subprocess`."""
    try:
        export_onnx(EncoderConfig.model_validate_json(config_json), Path(target))
    except OnnxExportError as err:
        print(_REFUSED + " ".join(str(err).split()), file=sys.stderr)
        sys.exit(3)


def quantize_onnx(export_dir: Path) -> None:
    """``model.int8.onnx``: ONNX Runtime's dynamic int8 quantisation of the fp32 export (weights int8, activations
    quantised per batch). Approximate by design: its vectors are not held to ONNX_TOLERANCE."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    work = export_dir / ".model.int8.onnx.partial"
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)  # the quantiser logs a line per tensor on the root logger
    try:
        # Per-channel weight scales: on MiniLM, cosine to fp32 >= 0.99 on the bundled questions (per-tensor: 0.94).
        quantize_dynamic(str(export_dir / "model.onnx"), str(work), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        logging.disable(previous)
    # Its record first: a record without its graph is ignored (and rewritten), a graph without its record is refused.
    record = export_dir / f".{INT8_RECORD}.partial"
    record.write_text(json.dumps(full_checksum(work)))
    os.replace(record, export_dir / INT8_RECORD)
    os.replace(work, export_dir / "model.int8.onnx")


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("torch", "transformers", "sentence-transformers", "onnxruntime"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def max_abs_difference(a, b, texts: list[str] | tuple[str, ...]) -> float:
    """Largest coordinate difference between two encoders' query vectors: as one padded batch and text by text."""
    batch = np.abs(a.encode_queries(list(texts)) - b.encode_queries(list(texts))).max()
    alone = max(float(np.abs(a.encode_queries([t]) - b.encode_queries([t])).max()) for t in texts)
    return float(max(batch, alone))
