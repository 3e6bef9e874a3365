"""The Ray Serve application. One request, top to bottom:

    parse JSON -> validate (pydantic, 422 on any bad input) -> join a dynamic batch ->
    encode all queries of the batch -> one index search -> one document-store lookup -> respond

Anything unexpected after validation becomes a 503 with a message (clients retry
it); nothing reaches the caller as a 500.
"""

# No `from __future__ import annotations` here: FastAPI must see real types (Request) on the ingress methods.
import asyncio
import logging
import os
import sys
import time
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from retrieval_server.batching import BacklogBatcher
from retrieval_server.config import ServerConfig

logger = logging.getLogger(__name__)

fastapi_app = FastAPI(title="retrieval-server", description="POST /retrieve: top-k passages per query")


# ---------------------------------------------------------------- validation
class RetrieveRequest(BaseModel):
    """The /retrieve body. Caps come from the server config through the validation context."""

    model_config = ConfigDict(extra="ignore")

    queries: list[StrictStr] = Field(min_length=1)
    topk: StrictInt | None = Field(default=None, ge=1)
    return_scores: StrictBool = True

    @model_validator(mode="after")
    def _within_caps(self, info: ValidationInfo) -> "RetrieveRequest":
        caps: ServerConfig | None = (info.context or {}).get("config")
        if caps is None:
            return self
        if len(self.queries) > caps.max_queries_per_request:
            raise ValueError(
                f"'queries' has {len(self.queries)} items, more than this server's cap "
                f"max_queries_per_request={caps.max_queries_per_request}; split the request"
            )
        if self.topk is not None and self.topk > caps.max_topk:
            raise ValueError(f"'topk' is {self.topk}, above this server's cap max_topk={caps.max_topk}")
        for i, query in enumerate(self.queries):
            if len(query) > caps.max_query_chars:
                raise ValueError(
                    f"queries[{i}] has {len(query)} characters, more than this server's cap "
                    f"max_query_chars={caps.max_query_chars}"
                )
        return self


class BadRequest(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _describe_validation_error(err: ValidationError | RequestValidationError) -> str:
    parts = []
    for e in err.errors():
        location = ""
        for part in e.get("loc", ()):
            if part == "body":
                continue
            location += f"[{part}]" if isinstance(part, int) else (f".{part}" if location else str(part))
        message = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{location}: {message}" if location else message)
    return "invalid request: " + "; ".join(parts)


def parse_and_validate(raw: bytes, config: ServerConfig) -> RetrieveRequest:
    try:
        body = orjson.loads(raw)  # also refuses invalid UTF-8
    except orjson.JSONDecodeError as err:
        raise BadRequest(f"request body is not valid JSON: {err}") from err
    if not isinstance(body, dict):
        raise BadRequest(
            f'request body must be a JSON object like {{"queries": ["..."], "topk": 3}}, got {type(body).__name__}'
        )
    try:
        return RetrieveRequest.model_validate(body, context={"config": config})
    except ValidationError as err:
        raise BadRequest(_describe_validation_error(err)) from err


def _problem(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": message})


# Safety nets for anything raised outside the handlers' own try blocks (routing, framework parsing).
@fastapi_app.exception_handler(RequestValidationError)
async def _on_validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
    return _problem(422, _describe_validation_error(err))


@fastapi_app.exception_handler(StarletteHTTPException)
async def _on_http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    return _problem(err.status_code, str(err.detail))


@fastapi_app.exception_handler(Exception)
async def _on_unexpected_error(request: Request, err: Exception) -> JSONResponse:
    logger.exception("unexpected error on %s", request.url.path)
    return _problem(503, f"retrieval failed: {type(err).__name__}: {err}")


# ---------------------------------------------------------------- metrics
class ServerMetrics:
    """Prometheus metrics of one replica (own registry: replicas never share counters)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "retrieval_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=self.registry
        )
        # Requests inside this replica (parsing, queued for a batch, or in one): if it stays near 1 under
        # heavy client concurrency, requests are queuing upstream (proxy), not in the batch queue.
        self.in_flight = Gauge(
            "retrieval_requests_in_flight", "Requests being handled by this replica", registry=self.registry
        )
        self.queries = Counter("retrieval_queries", "Queries answered", registry=self.registry)
        size_buckets = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
        self.batch_requests = Histogram(
            "retrieval_batch_requests", "Requests merged into one batch", buckets=size_buckets, registry=self.registry
        )
        self.batch_queries = Histogram(
            "retrieval_batch_queries",
            "Queries in one encoder pass / index search",
            buckets=size_buckets,
            registry=self.registry,
        )
        self.latency = Histogram(
            "retrieval_request_latency_seconds", "Latency of /retrieve inside the replica", registry=self.registry
        )
        self.stage = Histogram("retrieval_stage_seconds", "Time per batch stage", ["stage"], registry=self.registry)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# ---------------------------------------------------------------- deployment
@serve.deployment(name="RetrievalServer")
@serve.ingress(fastapi_app)
class RetrievalServer:
    def __init__(self, config: dict[str, Any]) -> None:
        from retrieval_server.search import Retriever

        self.config = ServerConfig.model_validate(config)
        self.retriever = Retriever(self.config)
        if (torch := sys.modules.get("torch")) is not None:  # loaded by a torch encoder or a reranker; ONNX needs none
            torch.set_num_threads(self.config.torch_threads)  # explicit: Ray's OMP_NUM_THREADS follows num_cpus instead
        self.metrics = ServerMetrics()
        self.started = time.time()
        self.batcher = BacklogBatcher(
            self._retrieve_batch,
            self.config.max_batch_size,
            self.config.batch_wait_timeout_s,
            concurrency=self.config.batch_concurrency_for(getattr(self.retriever.encoder, "backend", None)),
        )
        logger.info("retrieval replica ready: %d passages, method=%s", self.retriever.size, self.config.method)

    def _unauthorized(self, request: Request) -> JSONResponse | None:
        if self.config.token and request.headers.get("authorization") != f"Bearer {self.config.token}":
            return _problem(401, "missing or wrong bearer token (send 'Authorization: Bearer <token>')")
        return None

    @fastapi_app.post("/retrieve")
    async def retrieve(self, request: Request) -> Response:
        with self.metrics.in_flight.track_inprogress():
            return await self._retrieve(request)

    async def _retrieve(self, request: Request) -> Response:
        started = time.perf_counter()
        if (denied := self._unauthorized(request)) is not None:
            self.metrics.requests.labels("retrieve", "401").inc()
            return denied
        # 1. parse + 2. validate (behind Serve's proxy, reading the body is a round trip to the proxy: timed)
        raw = await request.body()
        self.metrics.stage.labels("receive_body").observe(time.perf_counter() - started)
        try:
            body = parse_and_validate(raw, self.config)
        except BadRequest as err:
            self.metrics.requests.labels("retrieve", "422").inc()
            return _problem(422, err.message)
        topk = body.topk or self.config.default_topk
        # 3. batch -> 4. encode -> 5. search -> 6. look up (all in _retrieve_batch, shared with concurrent requests)
        try:
            queued = time.perf_counter()
            documents, scores = await self.batcher.submit((body.queries, topk))
            self.metrics.stage.labels("batch_wait_and_run").observe(time.perf_counter() - queued)
        except Exception as err:  # a failure of the batch must not surface as a 500
            logger.exception("batch failed")
            self.metrics.requests.labels("retrieve", "503").inc()
            return _problem(503, f"retrieval failed: {type(err).__name__}: {err}")
        # 7. respond
        if body.return_scores:
            result = [
                [{"document": doc, "score": score} for doc, score in zip(query_docs, query_scores)]
                for query_docs, query_scores in zip(documents, scores)
            ]
        else:
            result = [[{"document": doc} for doc in query_docs] for query_docs in documents]
        self.metrics.requests.labels("retrieve", "200").inc()
        self.metrics.queries.inc(len(body.queries))
        self.metrics.latency.observe(time.perf_counter() - started)
        # orjson: ~100x faster than json.dumps for a 32-query answer (1 ms -> 0.01 ms), same bytes for these types.
        return Response(orjson.dumps({"result": result}), media_type="application/json")

    async def _retrieve_batch(
        self, items: list[tuple[list[str], int]]
    ) -> list[tuple[list[list[dict]], list[list[float]]]]:
        """One encoder pass, one index search and one store lookup for every query of every waiting request."""
        queries = [q for request_queries, _ in items for q in request_queries]
        query_topk = [k for request_queries, k in items for _ in request_queries]  # each query keeps its request's k
        self.metrics.batch_requests.observe(len(items))
        self.metrics.batch_queries.observe(len(queries))
        # The heavy work runs in a thread so the event loop keeps receiving requests for the next batch meanwhile.
        rows, scores, documents = await asyncio.to_thread(self._encode_search_lookup, queries, query_topk)
        width = rows.shape[1]
        hits = (rows >= 0).sum(axis=1).tolist()  # search blanked the columns past each query's k (and misses)
        score_lists = scores.tolist()  # Python floats once per batch, not one numpy scalar at a time
        out = []
        offset = 0
        for request_queries, _ in items:
            per_request = range(offset, offset + len(request_queries))
            per_request_docs = [documents[q * width : q * width + hits[q]] for q in per_request]
            per_request_scores = [score_lists[q][: hits[q]] for q in per_request]
            out.append((per_request_docs, per_request_scores))
            offset += len(request_queries)
        return out

    def _encode_search_lookup(
        self, queries: list[str], query_topk: list[int]
    ) -> tuple[np.ndarray, np.ndarray, list[dict]]:
        t0 = time.perf_counter()
        vectors = self.retriever.encode(queries)
        t1 = time.perf_counter()
        rows, scores = self.retriever.search(queries, vectors, query_topk)
        t2 = time.perf_counter()
        # Misses (-1) fetch row 0 as a placeholder and are dropped by the caller.
        documents = self.retriever.lookup(np.where(rows >= 0, rows, 0).reshape(-1))
        t3 = time.perf_counter()
        self.metrics.stage.labels("encode").observe(t1 - t0)
        self.metrics.stage.labels("search").observe(t2 - t1)
        self.metrics.stage.labels("lookup").observe(t3 - t2)
        return rows, scores, documents

    @fastapi_app.get("/health")
    async def health(self) -> dict:
        torch = sys.modules.get("torch")
        self.metrics.requests.labels("health", "200").inc()
        manifest = self.retriever.manifest
        return {
            "status": "ok",
            "index_size": self.retriever.size,
            "model": manifest["encoder"]["model"],
            "dim": manifest["dim"],
            "index_type": manifest["index"]["factory"],
            "method": self.config.method,
            "reranker": self.config.rerank_model,
            "uptime_s": round(time.time() - self.started, 3),
            "replica_pid": os.getpid(),
            "torch_threads": torch.get_num_threads() if torch else None,  # None: this replica runs without torch
            "encoder_backend": getattr(self.retriever.encoder, "backend", None),  # None: bm25 needs no encoder
            "batch_concurrency": self.batcher.concurrency,
        }

    @fastapi_app.get("/metrics")
    async def metrics(self, request: Request):
        if (denied := self._unauthorized(request)) is not None:
            return denied
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")
