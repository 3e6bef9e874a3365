"""Scale benchmark: a corpus and index of wiki-18's shape, adopted and served as a Search-R1 user would.

wiki-18 (Search-R1's ``wiki-18.jsonl``) holds 21,015,324 passages with FlashRAG ids
(``"0"``, ``"1"``, ...) and ``"\\"Title\\"\\ntext"`` contents of 100 words, ~14 GB of text.
This benchmark writes a synthetic corpus of that shape (titles unique, text drawn from
a pool of generated 100-word passages) and an IVF-PQ index with the same row count, then
runs the real commands on them:

  1. ``retrieval-server adopt``: conversion time and peak RSS (target: peak <= 4 GiB at 21M rows);
  2. ``retrieval-server serve --mmap-index``: seconds until ``/health`` answers (target <= 60 s),
     replica and server RSS/PSS idle and after load;
  3. ``/retrieve`` p50/p99 at 1, 32 and 64 one-query clients;
  4. store lookups of 1, 32 and 512 random hits (target: 512 hits <= 5 ms p50), beside the
     alternative the store rejects: ``Table.take`` over a ``large_string`` column, which
     concatenates the column on every call (measured on the store's first 2.3 GB).

The vectors need not be real for any of these, except where ``adopt`` checks the declared
encoder: the rows it will sample (same seed) hold the packaged MiniLM's true vectors, the
others random PQ codes written straight into the inverted lists (encoding 21M random vectors
would only measure FAISS). Nothing here is asserted; the targets are printed beside the numbers.

    python benchmarks/scale.py [--rows 21015324] [--work-dir DIR] [--keep] [--seconds-per-level 20]

It checks the free disk first (the corpus and the store take ~1.4 KB per passage together) and
refuses a size that does not fit; ``--rows auto`` takes the largest that does, and the report
says when numbers are extrapolated to 21M. Everything it wrote is deleted unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from retrieval_server.haproxy_front import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))

WIKI18_PASSAGES = 21_015_324
WORDS_PER_PASSAGE = 100
BYTES_PER_ROW_ON_DISK = 1_450  # JSONL (~700) + Arrow store (~690) + index (~60), measured on the synthetic rows
GIB = 2**30
VERIFY_SAMPLE = 32
SEED = 0

VOCABULARY = [
    "the",
    "of",
    "and",
    "in",
    "to",
    "was",
    "a",
    "is",
    "for",
    "on",
    "as",
    "by",
    "with",
    "he",
    "at",
    "from",
    "his",
    "an",
    "were",
    "are",
    "which",
    "it",
    "that",
    "this",
    "also",
    "be",
    "had",
    "or",
    "first",
    "one",
    "their",
    "its",
    "new",
    "after",
    "but",
    "who",
    "not",
    "they",
    "has",
    "her",
    "she",
    "two",
    "been",
    "other",
    "when",
    "there",
    "all",
    "during",
    "into",
    "school",
    "time",
    "may",
    "years",
    "more",
    "most",
    "only",
    "over",
    "city",
    "three",
    "film",
    "world",
    "university",
    "state",
    "national",
    "team",
    "season",
    "war",
    "river",
    "album",
    "music",
    "born",
    "known",
    "later",
    "part",
    "united",
    "american",
    "series",
    "family",
    "game",
    "house",
    "church",
    "village",
    "north",
    "south",
    "county",
    "station",
    "league",
    "album",
    "records",
    "party",
    "district",
    "government",
    "island",
    "football",
    "population",
    "line",
    "century",
    "army",
]


def write_corpus(path: Path, rows: int, seed: int = SEED) -> float:
    """wiki-18-shaped JSONL: ids "0".."n-1", contents '"Title"\\ntext' of 100 words; returns seconds."""
    rng = np.random.default_rng(seed)
    vocabulary = np.array(VOCABULARY)
    # 4,096 distinct 100-word texts, each line gets a unique title: lines are unique, generation stays fast.
    pool = [" ".join(rng.choice(vocabulary, WORDS_PER_PASSAGE)) for _ in range(4096)]
    started = time.perf_counter()
    with open(path, "w", encoding="utf-8", buffering=1 << 24) as handle:
        for start in range(0, rows, 65_536):
            stop = min(start + 65_536, rows)
            handle.write(
                "".join(
                    f'{{"id": "{i}", "contents": "\\"Passage {i}\\"\\n{pool[(i * 2654435761) % 4096]}"}}\n'
                    for i in range(start, stop)
                )
            )
    return time.perf_counter() - started


def passages_at(corpus: Path, rows: np.ndarray) -> list[str]:
    """The contents of the given (sorted) rows, read by streaming the file once."""
    wanted = {int(r): None for r in rows}
    remaining = len(wanted)
    with open(corpus, encoding="utf-8") as handle:
        for row, line in enumerate(handle):
            if row in wanted:
                wanted[row] = json.loads(line)["contents"]
                remaining -= 1
                if not remaining:
                    break
    return [wanted[int(r)] for r in rows]


def write_ivf_pq_index(path: Path, corpus: Path, rows: int, nlist: int, m: int) -> tuple[float, str]:
    """IVF<nlist>,PQ<m> over ``rows`` vectors: MiniLM's true vectors at adopt's sampled rows, random codes elsewhere."""
    import faiss

    from retrieval_server.adopt import sample_rows
    from retrieval_server.config import EncoderConfig, packaged_minilm_path
    from retrieval_server.encoders import SentenceEncoder

    started = time.perf_counter()
    encoder = SentenceEncoder(EncoderConfig.for_model(packaged_minilm_path()), device="cpu")
    real_rows = sample_rows(rows, VERIFY_SAMPLE, SEED)
    real_vectors = encoder.encode_passages(passages_at(corpus, real_rows)).astype(np.float32)
    dim = real_vectors.shape[1]
    print(f"  index: {VERIFY_SAMPLE} true vectors in {time.perf_counter() - started:.0f} s", flush=True)

    rng = np.random.default_rng(SEED)
    # FAISS's minimum training set (39 points a centroid): what the centroids are does not matter here.
    train = rng.standard_normal((39 * max(nlist, 256), dim), dtype=np.float32)
    train = np.concatenate([train / np.linalg.norm(train, axis=1, keepdims=True), real_vectors])
    factory = f"IVF{nlist},PQ{m}"
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(train)
    print(f"  index: trained {factory} at {time.perf_counter() - started:.0f} s", flush=True)
    index.add_with_ids(real_vectors, real_rows.astype(np.int64))
    # Every other row: a random list and a random code, written straight into the inverted lists.
    is_real = np.zeros(rows, dtype=bool)
    is_real[real_rows] = True
    invlists = index.invlists
    code_size = invlists.code_size
    for start in range(0, rows, 1 << 20):
        ids = np.arange(start, min(start + (1 << 20), rows), dtype=np.int64)
        ids = ids[~is_real[ids]]
        lists = rng.integers(0, nlist, len(ids))
        codes = rng.integers(0, 256, (len(ids), code_size), dtype=np.uint8)
        order = np.argsort(lists, kind="stable")
        lists, ids, codes = lists[order], ids[order], np.ascontiguousarray(codes[order])
        bounds = np.flatnonzero(np.r_[True, lists[1:] != lists[:-1], True])
        for begin, end in itertools.pairwise(bounds):
            invlists.add_entries(
                int(lists[begin]), int(end - begin), faiss.swig_ptr(ids[begin:end]), faiss.swig_ptr(codes[begin:end])
            )
    index.ntotal = rows
    faiss.write_index(index, str(path))
    return time.perf_counter() - started, factory


def run_measured(command: list[str], log: Path, env: dict | None = None) -> dict:
    """Run a command to its end; seconds and peak RSS (the child's own high-water mark, from wait4)."""
    started = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} failed ({process.returncode}); its output: {log}\n{log.read_text()[-3000:]}"
        )
    return {"seconds": seconds, "peak_rss_gib": usage.ru_maxrss * 1024 / GIB}


def tree_memory(pid: int) -> dict:
    """RSS and PSS summed over a process and its descendants (PSS splits pages shared between them)."""
    import psutil

    root = psutil.Process(pid)
    rss = pss = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, pss = rss + info.rss, pss + info.pss
    return {"rss_gib": rss / GIB, "pss_gib": pss / GIB}


def process_memory(pid: int) -> dict:
    import psutil

    info = psutil.Process(pid).memory_full_info()
    return {"rss_gib": info.rss / GIB, "pss_gib": info.pss / GIB}


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> dict:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited ({process.returncode}) before it was ready")
        try:
            response = httpx.get(f"{url}/health", timeout=5)
            if response.status_code == 200:
                return response.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"the server was not ready within {timeout_s:.0f} s")


def ensure_ours(replica_pid: int, server_pid: int, port: int) -> None:
    """Refuse to measure another server: on a shared machine a second server may have bound the same port."""
    import psutil

    ours = {p.pid for p in psutil.Process(server_pid).children(recursive=True)}
    if replica_pid not in ours:
        raise SystemExit(
            f"port {port} is answered by a replica (pid {replica_pid}) that is not this benchmark's server: "
            "another server shares the port; run again"
        )


def load_levels(url: str, seconds_per_level: float) -> list[dict]:
    from retrieval import run_load

    from retrieval_server.recall import load_qa
    from verl_evidence.bundled import qa_path as bundled_qa_path

    questions = [q["question"] for q in load_qa(bundled_qa_path())]
    asyncio.run(run_load(url, questions, clients=4, queries_per_request=1, requests_per_client=8))  # warm-up
    levels = []
    for clients in (1, 32, 64):
        # Size each level from a short probe so that it lasts about ``seconds_per_level``.
        probe = asyncio.run(run_load(url, questions, clients=clients, queries_per_request=1, requests_per_client=2))
        per_client = max(2, int(seconds_per_level * probe["qps"] / clients))
        levels.append(
            asyncio.run(
                run_load(url, questions, clients=clients, queries_per_request=1, requests_per_client=per_client)
            )
        )
    return levels


def lookup_times(store_path: Path, rows: int, repeats: int = 200) -> dict:
    """Random lookups, first as they come (pages may still be on disk), then with the store in the page cache."""
    from retrieval_server.docstore import DocumentStore

    started = time.perf_counter()
    store = DocumentStore(store_path)
    out: dict = {"batches": store.num_batches, "open_seconds": time.perf_counter() - started}
    rng = np.random.default_rng(1)

    def measure() -> dict:
        result = {}
        for hits in (1, 32, 512):
            times = []
            for _ in range(repeats):
                wanted = rng.integers(0, rows, hits)
                began = time.perf_counter()
                store.lookup(wanted)
                times.append(time.perf_counter() - began)
            result[hits] = {"p50_ms": 1000 * float(np.median(times)), "p99_ms": 1000 * float(np.percentile(times, 99))}
        return result

    out["cold"] = measure()
    # A serving node keeps the store's pages once it has read them: read the file once, as a long-running server has.
    with open(store_path, "rb", buffering=0) as handle:
        while handle.read(1 << 24):
            pass
    out["warm"] = measure()
    return out


def concatenating_take_times(store_path: Path, max_bytes: int = int(2.3e9), repeats: int = 5) -> dict | None:
    """The rejected design: one ``large_string`` table, ``Table.take`` across its chunks (it concatenates them)."""
    import pyarrow as pa

    from retrieval_server.docstore import DocumentStore

    store = DocumentStore(store_path)
    batches, size = [], 0
    for batch in store._batches:
        if size >= max_bytes:
            break
        batches.append(batch)
        size += batch.nbytes
    if len(batches) < 2:
        return None
    schema = pa.schema([("id", pa.string()), ("contents", pa.large_string())])
    table = pa.Table.from_batches(batches).cast(schema)  # an in-memory large_string copy, as such a store would hold
    rows = table.num_rows
    rng = np.random.default_rng(2)
    out = {"gib": size / GIB, "rows": rows}
    for hits in (1, 512):
        times, per_batch = [], []
        for _ in range(repeats):
            wanted = rng.integers(0, rows, hits)
            started = time.perf_counter()
            taken = table.take(pa.array(wanted))
            taken.column(0).to_pylist(), taken.column(1).to_pylist()
            times.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.lookup(wanted)
            per_batch.append(time.perf_counter() - started)
        out[hits] = {"take_ms": 1000 * float(np.median(times)), "per_batch_ms": 1000 * float(np.median(per_batch))}
    return out


def prepare(work: Path, rows: int, nlist: int, pq: int, bin_dir: Path) -> dict:
    """Corpus, index and ``adopt``: the build half of the benchmark; returns its measurements."""
    report: dict = {}
    corpus = work / "wiki-18.jsonl"
    report["corpus_seconds"] = write_corpus(corpus, rows)
    report["corpus_gib"] = corpus.stat().st_size / GIB
    print(f"corpus: {report['corpus_gib']:.2f} GiB in {report['corpus_seconds']:.0f} s", flush=True)

    index_file = work / "ivf_pq.index"
    report["index_seconds"], report["index_factory"] = write_ivf_pq_index(index_file, corpus, rows, nlist, pq)
    report["index_gib"] = index_file.stat().st_size / GIB
    print(f"index: {report['index_factory']}, {report['index_gib']:.2f} GiB in {report['index_seconds']:.0f} s")

    from retrieval_server.config import packaged_minilm_path

    adopted = work / "adopted"
    adopt = run_measured(
        [str(bin_dir / "retrieval-server"), "adopt", "--index", str(index_file), "--corpus", str(corpus),
         "--output", str(adopted), "--model", packaged_minilm_path(), "--verify-sample", str(VERIFY_SAMPLE),
         "--seed", str(SEED)],
        work / "adopt.log",
    )  # fmt: skip
    report["adopt"] = adopt
    report["store_gib"] = (adopted / "docstore.arrow").stat().st_size / GIB
    print(f"adopt: {adopt['seconds']:.0f} s, peak RSS {adopt['peak_rss_gib']:.2f} GiB", flush=True)
    corpus.unlink()  # the store holds the text now; frees ~14 GB before the server maps the store
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=str(WIKI18_PASSAGES), help="Passages (default: wiki-18's count), or 'auto'")
    parser.add_argument("--work-dir", type=Path, default=None, help="Where to write (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="Keep the corpus, index and store")
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--pq", type=int, default=48, help="PQ sub-quantisers (384-d MiniLM: 8 dims each)")
    parser.add_argument("--seconds-per-level", type=float, default=20.0)
    parser.add_argument("--json", type=Path, default=None, help="Also write the report here")
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        help="Extra flag for `serve`, repeatable (e.g. --serve-arg=--ingress=proxy)",
    )
    parser.add_argument(
        "--reuse", action="store_true", help="Serve and measure an index a --keep run left in --work-dir (no rebuild)"
    )
    args = parser.parse_args()
    if args.reuse and not (args.work_dir and (args.work_dir / "prepared.json").exists()):
        raise SystemExit("--reuse needs --work-dir of an earlier --keep run (with its prepared.json)")

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="scale-bench-", dir=os.environ.get("SCALE_BENCH_DIR")))
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free
    fits = int((free - 4 * GIB) / BYTES_PER_ROW_ON_DISK)
    rows = min(fits, WIKI18_PASSAGES) if args.rows == "auto" else int(args.rows)
    if args.reuse:
        prepared = json.loads((work / "prepared.json").read_text())
        rows = fits = prepared["rows"]
    if rows > fits:
        raise SystemExit(
            f"{rows:,} passages need ~{rows * BYTES_PER_ROW_ON_DISK / GIB:.0f} GiB under {work}, "
            f"{free / GIB:.0f} GiB are free: pass --rows auto (at most {fits:,} here) or another --work-dir"
        )
    print(f"scale benchmark: {rows:,} passages under {work} ({free / GIB:.0f} GiB free)", flush=True)
    report: dict = {"rows": rows, "extrapolated_to_wiki18": rows < WIKI18_PASSAGES}
    bin_dir = Path(sys.executable).parent
    adopted = work / "adopted"
    try:
        if args.reuse:
            report.update(prepared)
            print("reusing the corpus, index and store of an earlier run (their numbers are that run's)", flush=True)
        else:
            report.update(prepare(work, rows, args.nlist, args.pq, bin_dir))
            (work / "prepared.json").write_text(json.dumps(report))

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        started = time.perf_counter()
        with open(work / "serve.log", "w") as serve_log:  # the child keeps its own descriptor
            server = subprocess.Popen(
                [str(bin_dir / "retrieval-server"), "serve", "--index-dir", str(adopted), "--mmap-index", "--port",
                 str(port), *args.serve_arg],
                stdout=serve_log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            health = wait_healthy(url, server, timeout_s=600)
            ensure_ours(health["replica_pid"], server.pid, port)
            report["serve_ready_seconds"] = time.perf_counter() - started
            print(f"serve --mmap-index: ready in {report['serve_ready_seconds']:.1f} s", flush=True)
            time.sleep(2)
            pid = health["replica_pid"]
            report["idle"] = {"replica": process_memory(pid), "server": tree_memory(server.pid)}
            report["load"] = load_levels(url, args.seconds_per_level)
            after = wait_healthy(url, server, timeout_s=120)["replica_pid"]
            ensure_ours(after, server.pid, port)
            if after != pid:  # never measure a fresh replica as if it had served the load
                report["replica_restarted"] = True
                print(f"WARNING: the replica (pid {pid}) was replaced by pid {after} during the load", flush=True)
            report["after_load"] = {"replica": process_memory(after), "server": tree_memory(server.pid)}
        finally:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()

        report["lookup"] = lookup_times(adopted / "docstore.arrow", rows)
        report["concatenating_take"] = concatenating_take_times(adopted / "docstore.arrow")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print_report(report)


def print_report(report: dict) -> None:
    rows = report["rows"]
    scale = WIKI18_PASSAGES / rows
    print(f"\n## Scale benchmark: {rows:,} passages ({report['corpus_gib']:.1f} GiB of JSONL)")
    if report["extrapolated_to_wiki18"]:
        print(
            f"(smaller than wiki-18: times that grow with the corpus are extrapolated x{scale:.2f}, marked 'extrap.')"
        )
    adopt = report["adopt"]
    lines = [
        ("adopt: conversion time", f"{adopt['seconds']:.0f} s", "-"),
        ("adopt: peak RSS", f"{adopt['peak_rss_gib']:.2f} GiB", "<= 4 GiB"),
        ("store size", f"{report['store_gib']:.1f} GiB", "-"),
        (f"index ({report['index_factory']})", f"{report['index_gib']:.2f} GiB", "-"),
        ("serve --mmap-index: ready", f"{report['serve_ready_seconds']:.1f} s", "<= 60 s"),
    ]
    if report["extrapolated_to_wiki18"]:
        lines.insert(1, ("adopt: conversion time, extrap. to 21M", f"{adopt['seconds'] * scale:.0f} s", "-"))
    for phase in ("idle", "after_load"):
        for part in ("replica", "server"):
            memory = report[phase][part]
            lines.append(
                (
                    f"{part} memory {phase.replace('_', ' ')}",
                    f"RSS {memory['rss_gib']:.2f} / PSS {memory['pss_gib']:.2f} GiB",
                    "-",
                )
            )
    for level in report["load"]:
        latency = f"p50 {level['p50_ms']:.0f} ms, p99 {level['p99_ms']:.0f} ms"
        lines.append(
            (
                f"/retrieve, {level['clients']} one-query clients",
                f"{level['qps']:.0f} q/s, {latency}, errors {level['errors']}",
                "-",
            )
        )
    lookup = report["lookup"]
    lines.append((f"store open ({lookup['batches']} record batches)", f"{lookup['open_seconds']:.1f} s", "-"))
    for cache in ("cold", "warm"):
        for hits in (1, 32, 512):
            target = "<= 5 ms p50" if hits == 512 and cache == "warm" else "-"
            times = lookup[cache][hits]
            lines.append(
                (f"store lookup, {hits} hits, {cache} page cache",
                 f"p50 {times['p50_ms']:.2f} ms, p99 {times['p99_ms']:.2f} ms", target)
            )  # fmt: skip
    take = report.get("concatenating_take")
    if take:
        for hits in (1, 512):
            ratio = take[hits]["take_ms"] / max(take[hits]["per_batch_ms"], 1e-9)
            lines.append(
                (f"large_string Table.take vs per-batch, {hits} hits, first {take['gib']:.1f} GiB",
                 f"{take[hits]['take_ms']:.1f} ms vs {take[hits]['per_batch_ms']:.2f} ms ({ratio:.0f}x slower)", "-")
            )  # fmt: skip
    if report.get("replica_restarted"):
        lines.append(("replica replaced during the load", "yes: the after-load memory is the new replica's", "-"))
    width = max(len(name) for name, _, _ in lines)
    print(f"| {'measure'.ljust(width)} | value | target |\n|{'-' * (width + 2)}|---|---|")
    for name, value, target in lines:
        print(f"| {name.ljust(width)} | {value} | {target} |")


if __name__ == "__main__":
    main()
