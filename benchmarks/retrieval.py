"""Retrieval server benchmark (bounded: fixed request counts, stops by itself, 127.0.0.1 only).

Measures, in one run and on one index (bundled corpus, packaged MiniLM, Flat):
  * four servers at 1/8/32/64 concurrent clients with one query per request, and
    4 clients x 32 queries per request (QPS, p50/p95/p99, errors, replica RSS),
    level by level, so that drifting load on a shared machine hits all alike:
      onnx      our batched server with the ONNX Runtime encoder (the CPU default)
      torch     our batched server with the torch encoder
      naive     a Serve deployment encoding and searching each request alone,
                documents fetched row by row
      searchr1  Search-R1's serving shape: one uvicorn process, a sync FastAPI
                endpoint, one torch encode + search per request
    and identical top-k across them;
  * QPS served at 64 clients vs the in-process encode+search+lookup throughput
    at the batch size the server actually formed (no HTTP);
  * the ONNX encoder alone: encode throughput vs torch at batch 1/8/32 (one
    thread each), max |onnx - torch| and int8's recall@10 against fp32;
  * the RSS of a process serving a synthetic 1M x 384 Flat index vs its bytes;
  * recall@10 / bytes per vector of fp16 Flat and IVF-PQ on a synthetic 768-d set
    (the memory plan of docs/retrieval-server.md).

    python benchmarks/retrieval.py [--quick] [--skip-memory] [--skip-recall]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import numpy as np

from retrieval_server.config import ServerConfig as ServerConfigDefaults

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

CPUS_PER_REPLICA = 2.0  # the whole (2-core) machine, for every server alike
# torch threads for every torch encoder here (both batched replicas, naive, Search-R1-style, in-process limit):
# ServerConfig.torch_threads' default; one thread measured 4-8x faster than two on this shared 2-core machine.
TORCH_THREADS = 1
SERVERS = ("onnx", "torch", "naive", "searchr1")


# ---------------------------------------------------------------- the naive baseline
def naive_deployment():
    """Search-R1-style serving of the same index: every request alone, documents fetched row by row."""
    from fastapi import FastAPI
    from ray import serve

    naive_app = FastAPI()

    @serve.deployment(name="NaiveRetrievalServer", max_ongoing_requests=64)
    @serve.ingress(naive_app)
    class NaiveRetrievalServer:
        def __init__(self, index_dir: str, torch_threads: int) -> None:
            import torch

            from retrieval_server.config import ServerConfig
            from retrieval_server.search import Retriever

            torch.set_num_threads(torch_threads)  # same threads as the batched server
            self.retriever = Retriever(ServerConfig(index_dir=Path(index_dir), encoder_backend="torch"))

        @naive_app.post("/retrieve")
        def retrieve(self, body: dict) -> dict:  # sync: FastAPI runs it in a thread per request, like uvicorn workers
            queries, k = body["queries"], body.get("topk") or 3
            vectors = self.retriever.encoder.encode_queries(queries)
            rows, scores = self.retriever.dense.search(vectors, k)
            result = []
            for q in range(len(queries)):
                hits = []
                for j in range(k):
                    hit = {"document": self.retriever.docstore.lookup_one(int(rows[q, j]))}
                    if body.get("return_scores", True):
                        hit["score"] = float(scores[q, j])
                    hits.append(hit)
                result.append(hits)
            return {"result": result}

        @naive_app.get("/health")
        def health(self) -> dict:
            import torch

            return {"status": "ok", "replica_pid": os.getpid(), "torch_threads": torch.get_num_threads()}

    return NaiveRetrievalServer


def trivial_deployment():
    """The same proxy and HTTP path with no work: the ceiling Serve itself puts on requests per second."""
    from fastapi import FastAPI
    from ray import serve

    trivial_app = FastAPI()

    @serve.deployment(name="TrivialEndpoint", max_ongoing_requests=128)
    @serve.ingress(trivial_app)
    class TrivialEndpoint:
        @trivial_app.post("/retrieve")
        async def retrieve(self, body: dict) -> dict:
            return {"result": [[] for _ in body["queries"]]}

    return TrivialEndpoint


SEARCHR1_SCRIPT = textwrap.dedent(
    """
    # Search-R1's retrieval_server.py serving shape, on our index: one uvicorn process, a sync endpoint
    # (FastAPI runs it on its thread pool), one torch encode + one FAISS search per request, per-row lookup.
    import os, sys
    from pathlib import Path
    import torch, uvicorn
    from fastapi import FastAPI
    from retrieval_server.config import ServerConfig
    from retrieval_server.search import Retriever

    index_dir, port, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    retriever = Retriever(ServerConfig(index_dir=Path(index_dir), encoder_backend="torch"))
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(body: dict) -> dict:
        queries, k = body["queries"], body.get("topk") or 3
        rows, scores = retriever.dense.search(retriever.encoder.encode_queries(queries), k)
        return {"result": [
            [{"document": retriever.docstore.lookup_one(int(rows[q, j])), "score": float(scores[q, j])} for j in range(k)]
            for q in range(len(queries))
        ]}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "replica_pid": os.getpid(), "torch_threads": torch.get_num_threads()}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
    """
)


def start_searchr1_server(index_dir: Path) -> tuple[subprocess.Popen, str]:
    from retrieval_server.haproxy_front import free_port
    from retrieval_server.launch import _wait_healthy

    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", SEARCHR1_SCRIPT, str(index_dir), str(port), str(TORCH_THREADS)])
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, timeout_s=300)
    except BaseException:
        process.kill()
        raise
    return process, url


# ---------------------------------------------------------------- the encoder alone
def encoder_comparison(index_dir: Path, questions: list[str], seconds: float = 3.0) -> dict:
    """ONNX vs torch encode throughput (one thread each), equality, int8 recall@10.

    Throughput twice: per wall-clock second (best of three windows) and per CPU-second of this process
    (the encoders run on one thread, so CPU time is their work; it moves little when others load the machine).
    """
    import torch

    from retrieval_server.config import ServerConfig
    from retrieval_server.encoders import max_abs_difference
    from retrieval_server.search import Retriever

    torch.set_num_threads(TORCH_THREADS)
    retrievers = {
        backend: Retriever(ServerConfig(index_dir=index_dir, encoder_backend=backend, encode_threads=1))
        for backend in ("torch", "onnx", "onnx-int8")
    }
    rows = []
    for batch_size in (1, 8, 32):
        batch = [questions[j % len(questions)] for j in range(batch_size)]
        row = {"batch": batch_size}
        for backend, retriever in retrievers.items():
            retriever.encode(batch)  # warm-up
            best, done_all, cpu_started = 0.0, 0, time.process_time()
            for _ in range(3):
                done, started = 0, time.perf_counter()
                while time.perf_counter() - started < seconds / 3:
                    retriever.encode(batch)
                    done += batch_size
                best = max(best, done / (time.perf_counter() - started))
                done_all += done
            row[backend] = best
            row[f"{backend}_per_cpu_s"] = done_all / (time.process_time() - cpu_started)
        rows.append(row)
    fp32, int8 = retrievers["onnx"], retrievers["onnx-int8"]
    exact, _ = fp32.search(questions, fp32.encode(questions), 10)
    approx, _ = int8.search(questions, int8.encode(questions), 10)
    torch_rows, _ = retrievers["torch"].search(questions, retrievers["torch"].encode(questions), 10)
    return {
        "throughput": rows,
        "max_abs_diff_onnx_torch": max_abs_difference(retrievers["torch"].encoder, fp32.encoder, questions),
        "same_top10_onnx_torch": int(sum(np.array_equal(a, b) for a, b in zip(exact, torch_rows))),
        "int8_recall_at_10_vs_fp32": float(np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact)])),
        "questions": len(questions),
    }


# ---------------------------------------------------------------- load generation
async def run_load(url: str, questions: list[str], clients: int, queries_per_request: int, requests_per_client: int, probe_in_flight: bool = False) -> dict:
    # aiohttp, not httpx: httpx's AsyncClient itself tops out near 170 requests/s at 64 concurrent
    # connections on this machine (aiohttp: ~4,900 against a bare uvicorn app), which would cap every server alike.
    import aiohttp

    latencies: list[float] = []
    in_flight: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=clients + 4)
    async with aiohttp.ClientSession(base_url=url.rstrip("/") + "/", connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:

        async def client(n: int) -> None:
            nonlocal errors
            for i in range(requests_per_client):
                start = (n * requests_per_client + i) * queries_per_request
                batch = [questions[(start + j) % len(questions)] for j in range(queries_per_request)]
                t0 = time.perf_counter()
                try:
                    async with http.post("retrieve", json={"queries": batch, "topk": 3, "return_scores": True}) as response:
                        ok = response.status == 200 and len((await response.json())["result"]) == len(batch)
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    ok = False
                latencies.append(time.perf_counter() - t0)
                errors += 0 if ok else 1

        async def probe(done: asyncio.Event) -> None:
            # Requests inside the replica while the load runs: tells replica-side queuing from proxy-side queuing.
            while not done.is_set():
                async with http.get("metrics") as response:
                    text = await response.text()
                in_flight.append(float(re.search(r"^retrieval_requests_in_flight (\S+)$", text, re.M).group(1)))
                await asyncio.sleep(0.25)

        done = asyncio.Event()
        prober = asyncio.create_task(probe(done)) if probe_in_flight else None
        started, cpu_started = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client(n) for n in range(clients)))
        elapsed = time.perf_counter() - started
        loadgen_cpu = (time.process_time() - cpu_started) / elapsed  # cores the load generator itself used
        done.set()
        if prober is not None:
            await prober
    lat = np.asarray(latencies) * 1000
    total_queries = clients * requests_per_client * queries_per_request
    return {
        "clients": clients,
        "q_per_req": queries_per_request,
        "requests": len(latencies),
        "qps": total_queries / elapsed,
        "p50_ms": float(np.percentile(lat, 50)),
        "p95_ms": float(np.percentile(lat, 95)),
        "p99_ms": float(np.percentile(lat, 99)),
        "errors": errors,
        "loadgen_cpu": loadgen_cpu,
        **({"replica_in_flight_mean": float(np.mean(in_flight)), "replica_in_flight_max": float(np.max(in_flight))} if in_flight else {}),
    }


def replica_rss_mb(url: str) -> float:
    import psutil

    pid = httpx.get(f"{url}/health", timeout=30).json()["replica_pid"]
    return psutil.Process(pid).memory_info().rss / 2**20


def batch_queries_totals(url: str) -> tuple[float, float]:
    """(queries, batches) the replica has run so far, from its /metrics histogram."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    total = float(re.search(r"^retrieval_batch_queries_sum (\S+)$", text, re.M).group(1))
    count = float(re.search(r"^retrieval_batch_queries_count (\S+)$", text, re.M).group(1))
    return total, count


def top_k_ids(url: str, questions: list[str], k: int = 3) -> tuple[list[list[str]], list[list[float]]]:
    ids, scores = [], []
    for i in range(0, len(questions), 16):
        result = httpx.post(f"{url}/retrieve", json={"queries": questions[i : i + 16], "topk": k}, timeout=120).json()["result"]
        ids += [[h["document"]["id"] for h in hits] for hits in result]
        scores += [[h["score"] for h in hits] for hits in result]
    return ids, scores


def in_process_qps(index_dir: Path, questions: list[str], batch_size: int, backend: str, seconds: float = 4.0) -> float:
    """encode + search + lookup with the server's own Retriever and encoder settings, no HTTP."""
    import torch

    from retrieval_server.config import ServerConfig
    from retrieval_server.search import Retriever

    torch.set_num_threads(TORCH_THREADS)
    retriever = Retriever(ServerConfig(index_dir=index_dir, encoder_backend=backend, num_cpus_per_replica=CPUS_PER_REPLICA))
    batch = [questions[j % len(questions)] for j in range(batch_size)]
    retriever.lookup(retriever.search(batch, retriever.encode(batch), 3)[0].reshape(-1))  # warm-up
    best = 0.0
    for _ in range(3):  # best of three windows: the machine is shared, the limit is what it can do when free
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 3:
            rows, _ = retriever.search(batch, retriever.encode(batch), 3)
            retriever.lookup(rows.reshape(-1))
            done += batch_size
        best = max(best, done / (time.perf_counter() - started))
    return best


# ---------------------------------------------------------------- memory and recall of big/compressed indexes
MEMORY_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, faiss, psutil
    from pathlib import Path
    mode, path = sys.argv[1], sys.argv[2]
    n, d = 1_000_000, 384
    if mode == "write":
        index = faiss.IndexFlatIP(d)
        rng = np.random.default_rng(0)
        for start in range(0, n, 100_000):
            x = rng.standard_normal((100_000, d), dtype=np.float32)
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            index.add(x)
        faiss.write_index(index, path)
    else:
        from retrieval_server.search import DenseSearcher
        base = psutil.Process().memory_info().rss
        searcher = DenseSearcher(Path(path))
        q = np.random.default_rng(1).standard_normal((64, d), dtype=np.float32)
        searcher.search(q, 10)
        rss = psutil.Process().memory_info().rss
        print(rss, base, searcher.ntotal * d * 4)
    """
)


def memory_line(workdir: Path) -> dict:
    path = workdir / "flat-1m-384.faiss"
    subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, "write", str(path)], check=True)
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, "serve", str(path)], check=True, capture_output=True, text=True).stdout
    rss, base, index_bytes = (int(x) for x in out.split())
    path.unlink()
    return {"index_bytes": index_bytes, "rss": rss, "rss_before_load": base, "ratio": rss / index_bytes}


def recall_tradeoff(n: int, d: int = 768, n_queries: int = 500, seed: int = 0) -> list[dict]:
    """Recall@10 vs exact search on clustered synthetic vectors; bytes per vector of each index type."""
    import faiss

    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n // 50, d), dtype=np.float32)
    base = centers[rng.integers(0, len(centers), n)] + 0.6 * rng.standard_normal((n, d), dtype=np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[rng.choice(n, n_queries, replace=False)] + 0.3 * rng.standard_normal((n_queries, d), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact = faiss.IndexFlatIP(d)
    exact.add(base)
    _, truth = exact.search(queries, 10)
    nlist = max(64, int(4 * np.sqrt(n)))
    rows = []
    for factory, params in [
        ("SQfp16", [""]),
        (f"IVF{nlist},SQfp16", ["nprobe=16", "nprobe=64"]),
        (f"IVF{nlist},PQ96", ["nprobe=16", "nprobe=64"]),
        (f"IVF{nlist},PQ48", ["nprobe=64"]),
    ]:
        index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
        t0 = time.perf_counter()
        index.train(base[rng.choice(n, min(n, 40 * nlist), replace=False)])
        index.add(base)
        build_s = time.perf_counter() - t0
        code_bytes = faiss.serialize_index(index).nbytes / n
        for param in params:
            if param:
                faiss.ParameterSpace().set_index_parameters(index, param)
            _, found = index.search(queries, 10)
            recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)])
            rows.append({"index": factory, "params": param or "-", "recall@10": float(recall), "bytes/vector": code_bytes, "build_s": build_s})
    return rows


# ---------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests per level")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-recall", action="store_true")
    parser.add_argument("--skip-encoder", action="store_true", help="skip the encoder-alone comparison (the export still happens)")
    parser.add_argument("--recall-n", type=int, default=50_000)
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--batch-wait", type=float, default=ServerConfigDefaults.model_fields["batch_wait_timeout_s"].default, help="batched server's batch_wait_timeout_s")
    parser.add_argument("--ingress", choices=["auto", "haproxy", "proxy"], default="auto", help="HTTP front of our servers")
    parser.add_argument("--max-load", type=float, default=1.5, help="wait (up to 5 min) for the 1-minute load average to drop below this")
    args = parser.parse_args()

    import ray
    from ray import serve

    from retrieval_server.config import ServerConfig
    from retrieval_server.launch import ensure_index, start_server
    from retrieval_server.recall import load_qa
    from verl_evidence.bundled import corpus_path as bundled_corpus_path, qa_path as bundled_qa_path

    index_dir = ensure_index(bundled_corpus_path(), show_progress=False)
    waited = time.time()
    while os.getloadavg()[0] >= args.max_load and time.time() - waited < 300:
        time.sleep(10)
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at start: {load_at_start}", flush=True)
    questions = [q["question"] for q in load_qa(bundled_qa_path())]
    scale = 0.5 if args.quick else 1.0
    levels = [(1, 1, 60), (8, 1, 40), (32, 1, 16), (64, 1, 10), (4, 32, 10)]  # clients, queries/request, requests/client

    # Exported (once, cached beside the index) before any timing, so no server start pays for it mid-run.
    if not args.skip_encoder:
        report_encoder = encoder_comparison(index_dir, questions)
        print("encoder alone:", json.dumps(report_encoder), flush=True)

    def our_config(backend: str, **placement: object) -> ServerConfig:
        return ServerConfig(
            index_dir=index_dir, port=0, num_cpus_per_replica=CPUS_PER_REPLICA, torch_threads=TORCH_THREADS,
            encoder_backend=backend, max_batch_size=64, batch_wait_timeout_s=args.batch_wait, ingress=args.ingress,
            **placement,
        )  # fmt: skip

    # Logical CPUs for Ray: 2 per replica (the onnx and torch servers, naive); the machine has what it has.
    ours = start_server(our_config("onnx"), ray_num_cpus=8)
    torch_server = start_server(our_config("torch", app_name="torch", route_prefix="/torch"))
    searchr1_process, searchr1_url = start_searchr1_server(index_dir)
    urls = {"onnx": ours.url, "torch": torch_server.url, "naive": f"{ours.url}/naive", "searchr1": searchr1_url}
    health = httpx.get(f"{ours.url}/health").json()
    report: dict = {
        "index": {"dir": str(index_dir), "passages": health["index_size"]},
        "load_at_start": load_at_start,
        "batch_wait_s": args.batch_wait,
        "ingress": ours.ingress,
    }
    if not args.skip_encoder:
        report["encoder"] = report_encoder
    try:
        serve.run(
            naive_deployment().options(ray_actor_options={"num_cpus": CPUS_PER_REPLICA}).bind(str(index_dir), TORCH_THREADS),
            name="naive",
            route_prefix="/naive",
        )
        serve.run(trivial_deployment().options(ray_actor_options={"num_cpus": 0}).bind(), name="trivial", route_prefix="/trivial")
        healths = {name: httpx.get(f"{url}/health", timeout=30).json() for name, url in urls.items()}
        threads = {name: h["torch_threads"] for name, h in healths.items()}
        assert set(threads.values()) == {TORCH_THREADS}, f"torch threads differ: {threads}"
        backends = {name: healths[name]["encoder_backend"] for name in ("onnx", "torch")}
        assert backends == {"onnx": "onnx", "torch": "torch"}, f"encoder backends: {backends}"
        report["torch_threads"] = threads
        asyncio.run(run_load(f"{ours.url}/trivial", questions, 4, 1, 5))
        report["trivial_64"] = asyncio.run(run_load(f"{ours.url}/trivial", questions, 64, 1, max(2, int(10 * scale))))
        print("trivial endpoint:", json.dumps(report["trivial_64"]), flush=True)
        serve.delete("trivial")
        for url in urls.values():
            asyncio.run(run_load(url, questions, 4, 1, 5))  # warm-up
        table = []
        # Level by level, every server in turn: load from other users that drifts during the run hits all of them.
        for clients, qpr, per_client in levels:
            for name in SERVERS:
                url, batched = urls[name], name in ("onnx", "torch")
                before = batch_queries_totals(url) if batched else (0.0, 0.0)
                row = asyncio.run(run_load(url, questions, clients, qpr, max(2, int(per_client * scale)), probe_in_flight=batched))
                row["server"] = name
                row["rss_mb"] = replica_rss_mb(url)
                if batched:  # mean batch of this level alone (the histogram is cumulative)
                    after = batch_queries_totals(url)
                    row["mean_batch_queries"] = (after[0] - before[0]) / max(after[1] - before[1], 1.0)
                table.append(row)
                print(json.dumps(row), flush=True)
        report["load"] = table

        ids = {name: top_k_ids(url, questions) for name, url in urls.items()}
        report["identical_topk"] = {
            name: {
                "questions": len(questions),
                "same_ids": sum(a == b for a, b in zip(ids[name][0], ids["naive"][0])),
                "max_score_diff": float(np.max(np.abs(np.asarray(ids[name][1]) - np.asarray(ids["naive"][1])))),
            }
            for name in ("onnx", "torch", "searchr1")
        }
        serve.delete("naive")
        at64 = next(r for r in table if r["server"] == "onnx" and r["clients"] == 64 and r["q_per_req"] == 1)
        batch = max(1, round(at64["mean_batch_queries"]))
    finally:
        searchr1_process.terminate()
        searchr1_process.wait(timeout=30)
        torch_server.shutdown()
        ours.shutdown()
        if ray.is_initialized():
            ray.shutdown()

    limit = in_process_qps(index_dir, questions, batch, "onnx")
    report["limit"] = {"batch_size": batch, "in_process_qps": limit, "served_qps_at_64": at64["qps"], "ratio": at64["qps"] / limit}

    if not args.skip_memory:
        with tempfile.TemporaryDirectory() as tmp:
            report["memory_1m_384_flat"] = memory_line(Path(tmp))
    if not args.skip_recall:
        report["recall_tradeoff"] = {"n": args.recall_n, "d": 768, "rows": recall_tradeoff(args.recall_n)}

    report["loadavg"] = [round(x, 1) for x in os.getloadavg()]
    print_report(report)
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))


def print_report(report: dict) -> None:
    print(f"\nload average (1/5/15 min) at start {report.get('load_at_start')}, at end {report.get('loadavg')} (2 cores, shared)")
    print(
        f"index: {report['index']['passages']} passages (bundled corpus), MiniLM-L6 384-d, Flat; {CPUS_PER_REPLICA:g} CPUs per replica, "
        f"torch threads {report.get('torch_threads')}, batch wait {report.get('batch_wait_s', 0) * 1000:g} ms, "
        f"ingress {report.get('ingress')}\n"
    )
    if "encoder" in report:
        e = report["encoder"]
        print("encoder alone, one thread each: queries per second (best of three windows) | per CPU-second")
        print(f"{'batch':>5} {'torch':>8} {'onnx':>8} {'int8':>8} {'onnx/torch':>10} | {'torch':>8} {'onnx':>8} {'int8':>8} {'onnx/torch':>10}")
        for r in e["throughput"]:
            cpu = {b: r[f"{b}_per_cpu_s"] for b in ("torch", "onnx", "onnx-int8")}
            print(
                f"{r['batch']:>5} {r['torch']:>8.1f} {r['onnx']:>8.1f} {r['onnx-int8']:>8.1f} {r['onnx'] / r['torch']:>9.2f}x | "
                f"{cpu['torch']:>8.1f} {cpu['onnx']:>8.1f} {cpu['onnx-int8']:>8.1f} {cpu['onnx'] / cpu['torch']:>9.2f}x"
            )
        print(
            f"onnx vs torch on {e['questions']} questions: max |diff| {e['max_abs_diff_onnx_torch']:.1e}, same top-10 "
            f"{e['same_top10_onnx_torch']}/{e['questions']}; int8 recall@10 vs fp32 {e['int8_recall_at_10_vs_fp32']:.3f}\n"
        )
    print(f"{'server':8} {'clients':>7} {'q/req':>5} {'QPS':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'errors':>6} {'RSS MB':>7} {'loadgen CPU':>11} {'batch':>6}")
    for r in sorted(report["load"], key=lambda r: SERVERS.index(r["server"])):
        print(
            f"{r['server']:8} {r['clients']:>7} {r['q_per_req']:>5} {r['qps']:>8.1f} {r['p50_ms']:>8.1f} {r['p95_ms']:>8.1f} "
            f"{r['p99_ms']:>8.1f} {r['errors']:>6} {r['rss_mb']:>7.0f} {r['loadgen_cpu']:>10.2f}c "
            f"{r.get('mean_batch_queries', float('nan')):>6.1f}"
        )
    if "trivial_64" in report:
        t = report["trivial_64"]
        print(f"trivial endpoint (Serve proxy + HTTP, no work), 64 clients: {t['qps']:.1f} req/s, p99 {t['p99_ms']:.1f} ms, load generator {t['loadgen_cpu']:.2f} cores")
    by = {(r["server"], r["clients"], r["q_per_req"]): r for r in report["load"]}
    levels = sorted({(r["clients"], r["q_per_req"]) for r in report["load"]}, key=lambda level: (level[1], level[0]))
    print("\nQPS ratios per level:  onnx/torch  onnx/naive  onnx/searchr1  torch/naive")
    for clients, qpr in levels:
        qps = {name: by[(name, clients, qpr)]["qps"] for name in SERVERS}
        print(
            f"  {clients:>2} clients x {qpr:>2} q/req: {qps['onnx'] / qps['torch']:>9.2f}x {qps['onnx'] / qps['naive']:>10.2f}x "
            f"{qps['onnx'] / qps['searchr1']:>13.2f}x {qps['torch'] / qps['naive']:>11.2f}x"
        )
    for name, same in report["identical_topk"].items():
        print(f"identical top-3, {name} vs naive: {same['same_ids']}/{same['questions']} questions, max |score diff| {same['max_score_diff']:.2e}")
    for r in report["load"]:
        if "replica_in_flight_mean" in r:
            print(f"{r['server']}, {r['clients']} clients x {r['q_per_req']}: requests inside the replica mean {r['replica_in_flight_mean']:.1f}, max {r['replica_in_flight_max']:.0f}")
    lim = report["limit"]
    print(f"limit: onnx served {lim['served_qps_at_64']:.1f} QPS at 64 clients vs in-process {lim['in_process_qps']:.1f} QPS at batch {lim['batch_size']}: {lim['ratio']:.2f}")

    def check(name: str, value: float, bound: float, ok: bool) -> None:
        print(f"  {'PASS' if ok else 'FAIL'}  {name:48} measured {value:.2f} (bound {bound:g})")

    o32, t32, n32 = by[("onnx", 32, 1)], by[("torch", 32, 1)], by[("naive", 32, 1)]
    same = report["identical_topk"]
    print("\ntargets (issue 3; the default server, onnx, vs naive):")
    check("QPS at 32 clients >= 2x naive", o32["qps"] / n32["qps"], 2.0, o32["qps"] >= 2 * n32["qps"])
    check("p99 at 32 clients <= 0.5x naive", o32["p99_ms"] / n32["p99_ms"], 0.5, o32["p99_ms"] <= 0.5 * n32["p99_ms"])
    for name in ("onnx", "torch"):
        check(f"identical top-k ({name} vs naive)", same[name]["same_ids"] / same[name]["questions"], 1.0, same[name]["same_ids"] == same[name]["questions"])
    check("QPS at 64 clients >= 0.8x in-process", lim["ratio"], 0.8, lim["ratio"] >= 0.8)
    errors = sum(r["errors"] for r in report["load"])
    check("no errors", float(errors), 0.0, errors == 0)
    print("targets (issue 13):")
    check("32 clients: onnx QPS >= 2x torch batched", o32["qps"] / t32["qps"], 2.0, o32["qps"] >= 2 * t32["qps"])
    check("32 clients: onnx p99 <= 150 ms", o32["p99_ms"], 150.0, o32["p99_ms"] <= 150.0)
    o1, n1 = by[("onnx", 1, 1)], by[("naive", 1, 1)]
    check("1 client: onnx p50 <= naive p50 (ratio)", o1["p50_ms"] / n1["p50_ms"], 1.0, o1["p50_ms"] <= n1["p50_ms"])
    o432, n432 = by[("onnx", 4, 32)], by[("naive", 4, 32)]
    check("4 x 32: onnx QPS >= 1.5x naive", o432["qps"] / n432["qps"], 1.5, o432["qps"] >= 1.5 * n432["qps"])
    for clients, qpr in levels:
        o, s = by[("onnx", clients, qpr)], by[("searchr1", clients, qpr)]
        check(f"{clients} x {qpr}: onnx QPS >= Search-R1-style", o["qps"] / s["qps"], 1.0, o["qps"] >= s["qps"])
    if "memory_1m_384_flat" in report:
        m = report["memory_1m_384_flat"]
        print(f"memory: 1M x 384 Flat = {m['index_bytes'] / 2**20:.0f} MiB; serving process RSS {m['rss'] / 2**20:.0f} MiB = {m['ratio']:.3f} x index bytes")
    if "recall_tradeoff" in report:
        t = report["recall_tradeoff"]
        print(f"\nrecall trade-off on {t['n']:,} synthetic {t['d']}-d vectors (500 queries, vs exact inner product):")
        print(f"{'index':22} {'params':10} {'recall@10':>9} {'bytes/vec':>9} {'build s':>7}")
        for r in t["rows"]:
            print(f"{r['index']:22} {r['params']:10} {r['recall@10']:>9.3f} {r['bytes/vector']:>9.1f} {r['build_s']:>7.1f}")


if __name__ == "__main__":
    main()
