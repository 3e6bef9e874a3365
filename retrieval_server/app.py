"""The Ray Serve application. One request, top to bottom (``RetrievalServer._retrieve``):

    receive the body (413 past --max-body-bytes, before it is read whole; 408 past --http-request-timeout-s) ->
    parse JSON -> validate (pydantic, 422 on any bad input) -> admit (503 + Retry-After when the queue is full, or
    when answers not yet taken by their clients hold --max-unsent-answer-bytes) -> split into pieces of bounded work
    -> batch with other requests' pieces (a small request in a lane of its own) -> answer repeats from the result
    cache -> encode each distinct query once -> one index search -> one document-store lookup -> the hits as JSON (in
    the batch's thread) -> respond, a large answer in chunks no faster than its client takes them

A request waits at most --request-timeout-s, and its queued pieces are dropped when its client leaves. Anything
unexpected after validation becomes a 503 with a message (clients retry it); nothing reaches the caller as a 500.
"""

# No `from __future__ import annotations` here: FastAPI must see real types (Request) on the ingress methods.
import asyncio
import ctypes
import ctypes.util
import hmac
import itertools
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
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

# FastAPI's own /docs and /openapi.json are off: the deployment serves them itself, behind the token when one is set.
fastapi_app = FastAPI(
    title="retrieval-server",
    description="POST /retrieve: top-k passages per query",
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)


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


def problem(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": message}, headers=headers)


class BodyTooLarge(Exception):
    pass


def too_large(err: BodyTooLarge) -> JSONResponse:
    return problem(413, f"{err}; send fewer or shorter queries per request")


class BodyTooSlow(Exception):
    pass


async def receive_body(request: Request, limit: int, within_s: float | None = None) -> bytes:
    """The request's body, refused (:class:`BodyTooLarge`) as soon as its Content-Length or the bytes so far pass
    ``limit``: a 60 MB body is never held whole; and (:class:`BodyTooSlow`) when it has not arrived within
    ``within_s``. HAProxy waits for a body only as far as one of its buffers (16 KiB) holds it, so a larger body that
    stalls past that point reaches the replica, which must not hold it for Serve's tens of seconds."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {int(declared)} bytes is larger than this server's cap of {limit} bytes")
    chunks, size = [], 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"request body is larger than this server's cap of {limit} bytes")
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), within_s)
    except asyncio.TimeoutError:
        raise BodyTooSlow(
            f"the request body did not arrive within {within_s:g} s ({size} bytes came); send it whole"
        ) from None
    return b"".join(chunks)


def request_pieces(queries: list[str], topk: int, config: ServerConfig) -> list[list[str]]:
    """A request's queries in pieces of bounded work: at most max_batch_queries queries and max_batch_hits hits."""
    per_piece = max(1, min(config.max_batch_queries, config.max_batch_hits // topk))
    return [queries[i : i + per_piece] for i in range(0, len(queries), per_piece)]


def piece_cost(queries: list[str], topk: int, config: ServerConfig) -> int:
    """A piece's share of a batch, in queries: a query asking many hits counts as several (hits bound the lookup)."""
    n = len(queries)
    return max(n, -(-n * topk * config.max_batch_queries // config.max_batch_hits))


def hits_json(documents: list[dict], scores: list[float], return_scores: bool) -> bytes:
    """One query's hits as the JSON the contract sends (orjson: ~100x faster than json.dumps for these types)."""
    if return_scores:
        return orjson.dumps([{"document": doc, "score": score} for doc, score in zip(documents, scores)])
    return orjson.dumps([{"document": doc} for doc in documents])


# ---------------------------------------------------------------- answers not yet taken
# The replica's handlers run on the event loop of its HTTP server, so that sending a chunk of an answer waits until
# the connection takes it. Serve's default runs them on a loop of their own, whose sends only fill a queue: a slow
# reader's answer then sat whole in the replica (issue 54: ~25 MB per connection). Measured equal in speed (issue 22).
REPLICA_ENVIRONMENT = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}
# Answers up to this size go out as one body; larger ones in chunks of about this size, each sent once the client
# has taken the one before (the replica's HTTP server holds at most ~64 KiB per connection before it waits).
ANSWER_CHUNK_BYTES = 256 * 2**10
# Estimated size of one hit's JSON until this replica has measured its own (bundled corpus: ~490 bytes).
FIRST_BYTES_PER_HIT = 1024


class AnswerBudget:
    """Bytes of answers this replica holds that their clients have not taken yet, against a bound.

    A request is admitted with an estimate of its answer's size (its hits times the bytes per hit measured so far),
    which becomes the real size once the answer is written, and comes off chunk by chunk as the client takes it. A
    slow reader therefore holds at most its own answer, and past the bound new work is refused instead of memory
    growing with every connection. Requests of one small piece keep a reserve of an eighth of the bound.
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.held, self.bytes_per_hit = limit, 0, float(FIRST_BYTES_PER_HIT)
        self.released_since_trim = 0

    def estimate(self, hits: int) -> int:
        return int(hits * self.bytes_per_hit) + 64

    def fits(self, size: int, small: bool) -> bool:
        return self.held + size <= self.limit + (self.limit // 8 if small else 0)

    def lease(self, size: int) -> "AnswerLease":
        self.held += size
        return AnswerLease(self, size)

    def measured(self, hits: int, size: int) -> None:
        if hits:
            self.bytes_per_hit = max(self.bytes_per_hit * 0.9 + 0.1 * size / hits, size / hits)


class AnswerLease:
    """One answer's share of the :class:`AnswerBudget`; whatever is left of it comes back when it is closed (or
    collected: a response Starlette never started still gives its share back)."""

    def __init__(self, budget: AnswerBudget, size: int) -> None:
        self.budget, self.size = budget, size

    def resize(self, size: int) -> None:
        self.budget.held += size - self.size
        self.size = size

    def taken(self, size: int) -> None:
        size = min(size, self.size)
        self.size -= size
        self.budget.held -= size
        self.budget.released_since_trim += size

    def close(self) -> None:
        self.taken(self.size)

    __del__ = close


def _malloc_trim() -> None:
    """Give freed heap pages back to the system. An answer is many small byte strings built in a batch's thread; glibc
    keeps the pages they freed in that thread's arena, and a replica that once held slow readers' answers kept their
    size in RSS (issue 54: 3.4 GB after the connections had gone)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


_LIBC = ctypes.CDLL(ctypes.util.find_library("c")) if sys.platform.startswith("linux") else None
# After this many bytes of answers were released, the next idle moment trims the heap.
TRIM_AFTER_BYTES = 16 * 2**20


async def stream_answer(parts: list[bytes], lease: AnswerLease) -> AsyncIterator[bytes]:
    """``{"result":[...]}`` from each query's JSON, in chunks of about ANSWER_CHUNK_BYTES; each chunk's bytes come
    off the lease once the server has passed it on (its send returns only when the connection can take more)."""
    try:
        chunk, size, first = [b'{"result":['], 11, True
        for i, part in enumerate(parts):
            parts[i] = b""  # not kept past its chunk
            chunk.append(part if first else b"," + part)
            size, first = size + len(part) + 1, False
            if size >= ANSWER_CHUNK_BYTES:
                yield b"".join(chunk)
                lease.taken(size)
                chunk, size = [], 0
        chunk.append(b"]}")
        yield b"".join(chunk)
    finally:
        lease.close()


def _client_left(request: Request) -> "asyncio.Task[None]":
    """A task that ends when the client disconnects (the ASGI server's http.disconnect after the body)."""

    async def wait() -> None:
        if (await request.receive())["type"] != "http.disconnect":
            # Per ASGI nothing but a disconnect follows a whole body; a server that sends more tells us nothing here.
            await asyncio.Event().wait()

    return asyncio.ensure_future(wait())


# Safety nets for anything raised outside the handlers' own try blocks (routing, framework parsing).
@fastapi_app.exception_handler(RequestValidationError)
async def _on_validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
    return problem(422, _describe_validation_error(err))


@fastapi_app.exception_handler(StarletteHTTPException)
async def _on_http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    return problem(err.status_code, str(err.detail))


@fastapi_app.exception_handler(Exception)
async def _on_unexpected_error(request: Request, err: Exception) -> JSONResponse:
    logger.exception("unexpected error on %s", request.url.path)
    return problem(503, f"retrieval failed: {type(err).__name__}: {err}")


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
        self.cache_lookups = Counter(
            "retrieval_cache_lookups",
            "Queries by outcome: hit (answered by the result cache or a copy in the same batch) or miss (searched)",
            ["outcome"],
            registry=self.registry,
        )
        self.cache_hit_rate = Gauge(
            "retrieval_cache_hit_rate", "Share of queries answered without a search so far", registry=self.registry
        )
        self.shed = Counter(
            "retrieval_shed_requests", "Requests refused with 503 because the queue was full", registry=self.registry
        )
        self.client_left = Counter(
            "retrieval_client_left", "Requests whose client left before their answer", registry=self.registry
        )

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# ---------------------------------------------------------------- deployment
# One piece of a request in a batch: (queries, topk, return_scores); its result: one JSON array of hits per query.
Piece = tuple[list[str], int, bool]


@serve.deployment(name="RetrievalServer")
@serve.ingress(fastapi_app)
class RetrievalServer:
    def __init__(self, config: dict[str, Any]) -> None:
        from retrieval_server.search import ResultCache, Retriever

        self.config = ServerConfig.model_validate(config)
        self.retriever = Retriever(self.config)
        if (torch := sys.modules.get("torch")) is not None:  # loaded by a torch encoder or a reranker; ONNX needs none
            torch.set_num_threads(self.config.torch_threads)  # explicit: Ray's OMP_NUM_THREADS follows num_cpus instead
        self.metrics = ServerMetrics()
        self.started = time.time()
        self.cache = ResultCache(self.config.result_cache_size, self.config.method, str(self.config.index_dir))
        self.queries_seen = self.queries_searched = 0  # the cache's hit rate: repeats in a batch count as hits
        self.request_ids = itertools.count()
        self.own_routes = None  # the client forwarded requests go through (created on the first)
        self.batcher = BacklogBatcher(
            self._retrieve_batch,
            self.config.max_batch_queries,
            self.config.batch_wait_timeout_s,
            concurrency=self.config.batch_concurrency_for(getattr(self.retriever.encoder, "backend", None)),
            size_of=lambda piece: piece_cost(piece[0], piece[1], self.config),
            strict=True,
            max_items=self.config.max_batch_size,
        )
        # Small requests' own lane: one more batch at a time, of small requests only. Behind a flood of 512-query
        # requests a one-query request waited for a running batch of large pieces and then ran inside the next one
        # (p99 1.15 s in issue 54's flood); here it waits for neither.
        self.small_lane = BacklogBatcher(
            self._retrieve_batch,
            self.config.max_batch_queries,
            concurrency=1,
            size_of=lambda piece: piece_cost(piece[0], piece[1], self.config),
            strict=True,
            max_items=self.config.max_batch_size,
        )
        self.answers = AnswerBudget(self.config.max_unsent_answer_bytes)
        logger.info("retrieval replica ready: %d passages, method=%s", self.retriever.size, self.config.method)

    def _unauthorized(self, request: Request, endpoint: str) -> JSONResponse | None:
        if not self.config.token:
            return None
        given = request.headers.get("authorization", "").encode()
        # Constant time: how much of a guess matched must not show in the answer's timing.
        if hmac.compare_digest(given, f"Bearer {self.config.token}".encode()):
            return None
        self.metrics.requests.labels(endpoint, "401").inc()
        return problem(401, "missing or wrong bearer token (send 'Authorization: Bearer <token>')")

    @fastapi_app.post("/retrieve")
    async def retrieve(self, request: Request) -> Response:
        with self.metrics.in_flight.track_inprogress():
            return await self._retrieve(request)

    async def _retrieve(self, request: Request) -> Response:
        started = time.perf_counter()
        if (denied := self._unauthorized(request, "retrieve")) is not None:
            return denied
        # 1. receive (behind Serve's proxy, reading the body is a round trip to the proxy: timed)
        try:
            raw = await receive_body(request, self.config.max_body_bytes, self.config.http_request_timeout_s)
        except BodyTooLarge as err:
            self.metrics.requests.labels("retrieve", "413").inc()
            # what it had read (up to the cap, in small pieces) goes back to the system like an answer's bytes
            self.answers.released_since_trim += self.config.max_body_bytes
            self._trim_when_due()
            return too_large(err)
        except BodyTooSlow as err:
            self.metrics.requests.labels("retrieve", "408").inc()
            return problem(408, str(err))
        self.metrics.stage.labels("receive_body").observe(time.perf_counter() - started)
        # 2. parse + validate
        try:
            body = parse_and_validate(raw, self.config)
        except BadRequest as err:
            self.metrics.requests.labels("retrieve", "422").inc()
            return problem(422, err.message)
        topk = body.topk or self.config.default_topk
        # 3. admit: a full queue sheds the request at once (a small one still fits where a large one does not)
        pieces = [(queries, topk, body.return_scores) for queries in request_pieces(body.queries, topk, self.config)]
        cost = sum(piece_cost(queries, topk, self.config) for queries, _, _ in pieces)
        small = len(pieces) == 1 and 0 < cost <= self.config.small_request_queries
        lane = self.small_lane if small else self.batcher
        # The last batch's worth of room is kept for requests of one piece: a flood of large requests never sheds
        # the small ones, which then go into the next batch (the pieces take turns).
        room = self.config.max_queued_queries - (self.config.max_batch_queries if len(pieces) > 1 else 0)
        if lane.queued_size and lane.queued_size + cost > room:
            self.metrics.shed.inc()
            self.metrics.requests.labels("retrieve", "503").inc()
            return problem(
                503,
                f"server busy: {lane.queued_size} queries queued, this request's {len(body.queries)} would "
                f"pass the bound max_queued_queries={self.config.max_queued_queries} (large requests: "
                f"{room}); retry later",
                headers={"Retry-After": "1"},
            )
        # ... and so do answers that their clients are slow to take (a small request keeps a reserve)
        estimate = self.answers.estimate(len(body.queries) * topk)
        if not self.answers.fits(estimate, small):
            self.metrics.shed.inc()
            self.metrics.requests.labels("retrieve", "503").inc()
            return problem(
                503,
                f"server busy: {self.answers.held / 2**20:.1f} MiB of answers are waiting for their clients to take "
                f"them; this request's (~{estimate / 2**20:.1f} MiB) would pass the bound max_unsent_answer_bytes="
                f"{self.config.max_unsent_answer_bytes}; retry later",
                headers={"Retry-After": "1"},
            )
        lease = self.answers.lease(estimate)
        # 4. batch -> 5. encode -> 6. search -> 7. look up (in _retrieve_batch, shared with concurrent requests)
        queued = time.perf_counter()
        request_id = next(self.request_ids)  # its pieces take turns with other requests' as one group
        waiting = [lane.enqueue(piece, group=request_id) for piece in pieces]  # queued before any await
        answer, left = asyncio.gather(*waiting), _client_left(request)
        try:
            done, _ = await asyncio.wait({answer, left}, timeout=self.config.request_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            if answer not in done:
                if left in done:
                    self.metrics.client_left.inc()
                    self.metrics.requests.labels("retrieve", "499").inc()
                    return problem(499, "client left")  # nobody reads it; nginx's code for it, not a 5xx
                self.metrics.requests.labels("retrieve", "503").inc()
                return problem(
                    503,
                    f"retrieval took longer than request_timeout_s={self.config.request_timeout_s:g} s "
                    f"({self.batcher.queued_size} queries still queued in this replica)",
                    headers={"Retry-After": "1"},
                )
            per_piece = answer.result()
        except Exception as err:  # a failure of the batch must not surface as a 500
            logger.exception("batch failed")
            self.metrics.requests.labels("retrieve", "503").inc()
            return problem(503, f"retrieval failed: {type(err).__name__}: {err}")
        finally:
            left.cancel()
            for piece in waiting:  # pieces still queued (timed out, client left, a sibling failed) are never run
                piece.cancel()
            if not answer.done() or answer.cancelled() or answer.exception() is not None:
                lease.close()
                self._trim_when_due()
        self.metrics.stage.labels("batch_wait_and_run").observe(time.perf_counter() - queued)
        # 8. respond: the hits are JSON already (built in the batch's thread); here they are only joined, and a large
        # answer is sent in chunks as its client takes them
        self.metrics.requests.labels("retrieve", "200").inc()
        self.metrics.queries.inc(len(body.queries))
        self.metrics.latency.observe(time.perf_counter() - started)
        parts = [query_hits for piece in per_piece for query_hits in piece]
        size = sum(len(part) + 1 for part in parts) + 12
        self.answers.measured(len(body.queries) * topk, size)
        if size <= ANSWER_CHUNK_BYTES:
            lease.close()
            return Response(b'{"result":[' + b",".join(parts) + b"]}", media_type="application/json")
        lease.resize(size)
        return StreamingResponse(self._send_answer(parts, lease), media_type="application/json")

    async def _send_answer(self, parts: list[bytes], lease: AnswerLease) -> AsyncIterator[bytes]:
        try:
            async for chunk in stream_answer(parts, lease):
                yield chunk
        finally:
            lease.close()
            self._trim_when_due()

    def _trim_when_due(self) -> None:
        # malloc_trim walks the heap (milliseconds for a few hundred MB): after enough was released, in a thread
        if self.answers.released_since_trim >= TRIM_AFTER_BYTES:
            self.answers.released_since_trim = 0
            asyncio.get_running_loop().run_in_executor(None, _malloc_trim)

    async def _retrieve_batch(self, pieces: list[Piece]) -> list[list[bytes]]:
        """One encoder pass, one index search and one store lookup for the distinct queries of every waiting piece.

        A query already answered (the result cache) or asked twice in the batch (the n samples of a GRPO prompt) is
        encoded and searched once; every copy gets the same hits.
        """
        wanted = [self.cache.key(query, topk) for queries, topk, _ in pieces for query in queries]
        known = {key: found for key in dict.fromkeys(wanted) if (found := self.cache.get(key)) is not None}
        missing = [key for key in dict.fromkeys(wanted) if key not in known]  # distinct, first-come order
        self.metrics.batch_requests.observe(len(pieces))
        self.metrics.batch_queries.observe(len(missing))
        self.metrics.cache_lookups.labels("hit").inc(len(wanted) - len(missing))
        self.metrics.cache_lookups.labels("miss").inc(len(missing))
        self.queries_seen, self.queries_searched = self.queries_seen + len(wanted), self.queries_searched + len(missing)
        self.metrics.cache_hit_rate.set(1 - self.queries_searched / self.queries_seen)
        # The heavy work runs in a thread so the event loop keeps receiving requests for the next batch meanwhile;
        # so does turning hits into JSON (at topk 100, a 512-query answer is 51,200 dicts).
        rendered, fresh = await asyncio.to_thread(self._search_and_render, pieces, wanted, known, missing)
        for key in missing:  # here, on the loop: the cache is not shared with the batches' threads
            self.cache.put(key, fresh[key])
        return rendered

    def _search_and_render(
        self, pieces: list[Piece], wanted: list[tuple], known: dict[tuple, tuple], missing: list[tuple]
    ) -> tuple[list[list[bytes]], dict[tuple, tuple]]:
        """Encode + search the missing queries, look up every distinct query's hits once, write each as JSON.

        A query's result is (rows, scores); the cache keeps those, not the passages (a topk-100 answer's passages
        weigh ~100 KB, its rows and scores ~1 KB), and the lookup of a cached answer is one more Arrow take.
        """
        found = dict(known)
        if missing:
            queries, query_topk = [key[0] for key in missing], [key[1] for key in missing]
            t0 = time.perf_counter()
            vectors = self.retriever.encode(queries)
            t1 = time.perf_counter()
            rows, scores = self.retriever.search(queries, vectors, query_topk)
            self.metrics.stage.labels("encode").observe(t1 - t0)
            self.metrics.stage.labels("search").observe(time.perf_counter() - t1)
            hits = (rows >= 0).sum(axis=1).tolist()  # search blanked the columns past each query's k (and misses)
            row_lists, score_lists = rows.tolist(), scores.tolist()  # Python numbers once per batch
            for q, key in enumerate(missing):
                found[key] = (row_lists[q][: hits[q]], score_lists[q][: hits[q]])
        t2 = time.perf_counter()
        distinct = list(dict.fromkeys(wanted))
        documents = self.retriever.lookup(np.asarray([row for key in distinct for row in found[key][0]], np.int64))
        t3 = time.perf_counter()
        passages, at = {}, 0
        for key in distinct:
            passages[key], at = documents[at : at + len(found[key][0])], at + len(found[key][0])
        out, at = [], 0
        for queries, _, return_scores in pieces:
            out.append(
                [hits_json(passages[key], found[key][1], return_scores) for key in wanted[at : at + len(queries)]]
            )
            at += len(queries)
        self.metrics.stage.labels("lookup").observe(t3 - t2)
        self.metrics.stage.labels("render").observe(time.perf_counter() - t3)
        return out, found

    # ------------------------------------------------------------ behind the Python proxy's front
    async def forwarded(
        self, method: str, path: str, query: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """A request the front deployment (``python_front``) read, answered by this replica's own routes above.

        It goes through the same FastAPI app in process (httpx's ASGI transport), so it takes exactly the path an
        HTTP request to this replica takes: the contract, the token, the bounds.
        """
        import httpx

        if self.own_routes is None:
            transport = httpx.ASGITransport(app=fastapi_app, raise_app_exceptions=False)
            self.own_routes = httpx.AsyncClient(transport=transport, base_url="http://replica", timeout=None)
        answer = await self.own_routes.request(
            method, path, params=httpx.QueryParams(query), headers=headers, content=body
        )
        return answer.status_code, list(answer.headers.items()), answer.content

    # ------------------------------------------------------------ the other routes
    @fastapi_app.get("/healthz")
    async def healthz(self) -> PlainTextResponse:
        """Liveness for load balancers and probes: open, and says nothing but ok."""
        return PlainTextResponse("ok")

    @fastapi_app.get("/health")
    async def health(self, request: Request) -> Response:
        if (denied := self._unauthorized(request, "health")) is not None:
            return denied  # paths and pids are for the token's holders
        torch = sys.modules.get("torch")
        self.metrics.requests.labels("health", "200").inc()
        manifest = self.retriever.manifest
        return JSONResponse(
            {
                "status": "ok",
                "index_size": self.retriever.size,
                "model": manifest["encoder"]["model"],
                "dim": manifest["dim"],
                "index_type": manifest["index"]["factory"],
                "method": self.config.method,
                "reranker": self.config.rerank_model,
                "uptime_s": round(time.time() - self.started, 3),
                "replica_pid": os.getpid(),
                "torch_threads": torch.get_num_threads() if torch else None,  # None: runs without torch
                "encoder_backend": getattr(self.retriever.encoder, "backend", None),  # None: bm25 needs no encoder
                "batch_concurrency": self.batcher.concurrency,
            }
        )

    @fastapi_app.get("/metrics")
    async def metrics(self, request: Request):
        if (denied := self._unauthorized(request, "metrics")) is not None:
            return denied
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    @fastapi_app.get("/openapi.json")
    async def openapi(self, request: Request) -> Response:
        if (denied := self._unauthorized(request, "openapi")) is not None:
            return denied
        return JSONResponse(fastapi_app.openapi())

    @fastapi_app.get("/docs")
    async def docs(self, request: Request) -> Response:
        if (denied := self._unauthorized(request, "docs")) is not None:
            return denied
        from fastapi.openapi.docs import get_swagger_ui_html

        prefix = request.scope.get("root_path", "")
        return get_swagger_ui_html(openapi_url=f"{prefix}/openapi.json", title="retrieval-server")
