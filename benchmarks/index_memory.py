"""Index memory benchmark: replicas sharing a memory-mapped Flat index, and the size of each converted index type.

Two measurements, both on synthetic vectors (no model), printed as ratios
against a baseline measured in the same run:

  1. Replica memory with and without ``--mmap-index``: two processes each load
     the same Flat index (default 200k x 384, 307 MB), search it exhaustively
     (every page touched), and report RSS, anonymous RSS and PSS while both are
     alive. PSS splits shared pages between the processes that map them, so the
     sum of PSS is what the two replicas cost the node.
  2. Converted index types: a clustered 768-d Flat index (default 100k vectors)
     converted with ``retrieval_server.convert.convert_flat`` to fp16, SQ8, HNSW
     and IVF-PQ; file bytes and loaded (anonymous) RSS per vector, recall@10
     against Flat, build seconds. Then the projection to wiki-18 (21,015,324 x
     768): fixed parts (centroids, codebooks) by arithmetic, per-vector parts from
     the measured bytes per vector.

    python benchmarks/index_memory.py [--quick] [--replica-n 200000] [--convert-n 100000]

Synthetic clustered vectors are harder for PQ than real sentence embeddings, so
the recall column is a lower bound for PQ; the memory columns do not depend on
the data.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

WIKI18_PASSAGES = 21_015_324  # DPR's 100-word Wikipedia passages (Search-R1's wiki-18.jsonl)
WIKI18_DIM = 768  # e5-base-v2
GIB = 2**30

# ---------------------------------------------------------------- 1. replicas sharing a mapped index
REPLICA = textwrap.dedent(
    """
    import sys, json
    import numpy as np
    from retrieval_server.index import read_dense_index

    def status():
        out = {}
        for line in open("/proc/self/status"):
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(line.split()[1]) * 1024
        for line in open("/proc/self/smaps_rollup"):
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1]) * 1024
        return out

    path, mmap = sys.argv[1], sys.argv[2] == "1"
    index = read_dense_index(path, mmap=mmap)
    queries = np.random.default_rng(1).standard_normal((8, index.d)).astype("float32")
    index.search(queries, 10)  # exhaustive: every vector page is touched
    print(json.dumps(status()), flush=True)
    sys.stdin.readline()  # stay alive until the parent has read every replica's numbers
    print(json.dumps(status()), flush=True)  # PSS again: now both replicas map the file
    """
)


def replica_memory(index_path: Path, mmap: bool, replicas: int = 2) -> list[dict]:
    """Start ``replicas`` processes on one index; their memory once all of them are up."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REPLICA, str(index_path), "1" if mmap else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(replicas)
    ]
    try:
        for proc in procs:
            json.loads(proc.stdout.readline())  # loaded and searched
        for proc in procs:
            proc.stdin.write("\n")
            proc.stdin.flush()
        return [json.loads(proc.stdout.readline()) for proc in procs]
    finally:
        for proc in procs:
            proc.wait(timeout=60)


def replica_section(workdir: Path, n: int, d: int = 384) -> dict:
    import faiss

    path = workdir / "replicas.index"
    vectors = np.random.default_rng(0).standard_normal((n, d), dtype=np.float32)
    index = faiss.IndexFlatIP(d)
    index.add(vectors)
    faiss.write_index(index, str(path))
    del index, vectors
    index_bytes = path.stat().st_size
    result = {"n": n, "d": d, "index_bytes": index_bytes}
    for mode in ("read", "mmap"):
        result[mode] = replica_memory(path, mmap=(mode == "mmap"))
    return result


# ---------------------------------------------------------------- 2. converted index types
def clustered(n: int, d: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(n // 50, 1), d), dtype=np.float32)
    base = centers[rng.integers(0, len(centers), n)] + 0.6 * rng.standard_normal((n, d), dtype=np.float32)
    return base / np.linalg.norm(base, axis=1, keepdims=True)


LOADED_ANON = textwrap.dedent(
    """
    import sys
    from retrieval_server.index import read_dense_index
    def anon():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    before = anon()
    index = read_dense_index(sys.argv[1])
    print(anon() - before)
    """
)


def loaded_bytes(path: Path) -> int:
    """Anonymous memory a process gains by reading the index (not memory-mapped)."""
    out = subprocess.run([sys.executable, "-c", LOADED_ANON, str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def reading_overhead(workdir: Path, d: int) -> int:
    """What reading any index costs a fresh process (allocator arenas, faiss statics): an empty Flat index's gain."""
    import faiss

    path = workdir / "empty.index"
    faiss.write_index(faiss.IndexFlatIP(d), str(path))
    return min(loaded_bytes(path) for _ in range(3))


def fixed_bytes(factory: str, d: int) -> int:
    """Bytes that do not grow with the vector count: IVF centroids, PQ codebooks, SQ ranges."""
    total = 0
    for part in factory.split(","):
        if part.startswith("IVF"):
            total += int(part[3:]) * d * 4
        elif part.startswith("PQ"):
            bits = int(part.split("x")[1]) if "x" in part else 8
            total += (2**bits) * d * 4  # m codebooks of 2^bits centroids of d/m floats
        elif part == "SQ8":
            total += 2 * d * 4
    return total


def conversion_section(workdir: Path, n: int, d: int, recall_queries: int) -> dict:
    import faiss

    from retrieval_server.convert import convert_flat, resolve_factory
    from retrieval_server.index import read_dense_index

    flat_path = workdir / "flat768.index"
    flat = faiss.IndexFlatIP(d)
    flat.add(clustered(n, d))
    faiss.write_index(flat, str(flat_path))
    del flat
    source = read_dense_index(flat_path, mmap=True)
    overhead = reading_overhead(workdir, d)
    rows = [
        {
            "target": "flat",
            "factory": "Flat",
            "file_bytes": flat_path.stat().st_size,
            "loaded_bytes": loaded_bytes(flat_path) - overhead,
            "recall": [{"search_params": "", "recall@10": 1.0}],
            "seconds": 0.0,
        }
    ]
    for target in ("fp16", "sq8", "hnsw", "ivf-pq"):
        factory = resolve_factory(target, n, d)
        started = time.perf_counter()
        index, tuning, _ = convert_flat(
            source, factory, train_sample=min(n, 100_000), recall_queries=recall_queries, k=10
        )
        seconds = time.perf_counter() - started
        path = workdir / f"{target}.index"
        faiss.write_index(index, str(path))
        del index
        rows.append(
            {
                "target": target,
                "factory": factory,
                "file_bytes": path.stat().st_size,
                "loaded_bytes": loaded_bytes(path) - overhead,
                "recall": tuning["recall"],  # nprobe/efSearch doubled up to recall@10 0.95; the last is served
                "seconds": round(seconds, 1),
            }
        )
        path.unlink()
        print(f"  converted to {factory} in {seconds:.1f} s", flush=True)
    for row in rows:
        row["per_vector_bytes"] = (row["file_bytes"] - fixed_bytes(row["factory"], d)) / n
        row["loaded_per_vector_bytes"] = (row["loaded_bytes"] - fixed_bytes(row["factory"], d)) / n
    return {"n": n, "d": d, "rows": rows, "reading_overhead_bytes": overhead}


# ---------------------------------------------------------------- wiki-18 arithmetic
def wiki18_plan(measured: dict | None = None) -> list[dict]:
    """Memory of each option for 21M x 768: arithmetic, and per-vector bytes measured at small scale."""
    n, d = WIKI18_PASSAGES, WIKI18_DIM
    per_vector = {
        "Flat (fp32)": (d * 4, 0, "flat"),
        "SQfp16 (fp16)": (d * 2, 0, "fp16"),
        "SQ8": (d, fixed_bytes("SQ8", d), "sq8"),
        "HNSW32,Flat": (
            d * 4 + 2 * 32 * 4 + 32 * 4 / 31 + 4 + 8,
            0,
            "hnsw",
        ),  # vectors + level-0 links + upper levels + level/offset
        "IVF65536,PQ96": (96 + 8, fixed_bytes("IVF65536,PQ96", d), "ivf-pq"),  # code + int64 id per vector
        "IVF65536,PQ64": (64 + 8, fixed_bytes("IVF65536,PQ64", d), None),
        "IVF65536,PQ48": (48 + 8, fixed_bytes("IVF65536,PQ48", d), None),
    }
    by_target = {row["target"]: row for row in (measured or {}).get("rows", [])}
    out = []
    for name, (bytes_per_vector, fixed, target) in per_vector.items():
        row = {"option": name, "arithmetic_gib": (n * bytes_per_vector + fixed) / GIB}
        if target in by_target:
            row["measured_gib"] = (n * by_target[target]["loaded_per_vector_bytes"] + fixed) / GIB
        out.append(row)
    return out


def print_report(report: dict) -> None:
    replicas = report.get("replicas")
    if replicas:
        mb = 2**20
        index_mib = replicas["index_bytes"] / mb
        print(f"\n== 2 replicas on one {replicas['n']} x {replicas['d']} Flat index ({index_mib:.0f} MiB) ==")
        print(f"{'mode':6} {'replica':>7} {'RSS MiB':>8} {'anon MiB':>9} {'file MiB':>9} {'PSS MiB':>8}")
        sums = {}
        for mode in ("read", "mmap"):
            for i, m in enumerate(replicas[mode]):
                print(
                    f"{mode:6} {i:>7} {m['VmRSS'] / mb:8.0f} {m['RssAnon'] / mb:9.0f}"
                    f" {m['RssFile'] / mb:9.0f} {m['Pss'] / mb:8.0f}"
                )
            sums[mode] = sum(m["Pss"] for m in replicas[mode])
        print(
            f"sum of PSS: read {sums['read'] / mb:.0f} MiB, mmap {sums['mmap'] / mb:.0f} MiB"
            f" -> ratio mmap/read {sums['mmap'] / sums['read']:.2f}"
        )
        anon = {mode: sum(m["RssAnon"] for m in replicas[mode]) for mode in ("read", "mmap")}
        print(
            f"private (anonymous) memory: read {anon['read'] / mb:.0f} MiB, mmap {anon['mmap'] / mb:.0f} MiB"
            f" -> ratio {anon['mmap'] / anon['read']:.2f}"
        )
    conv = report.get("conversion")
    if conv:
        print(f"\n== convert_flat on {conv['n']} x {conv['d']} clustered synthetic vectors ==")
        overhead_mib = conv["reading_overhead_bytes"] / 2**20
        print(
            "(RAM: anonymous memory a process gains reading the index,"
            f" less {overhead_mib:.1f} MiB for reading an empty one)"
        )
        flat = conv["rows"][0]
        print(
            f"{'target':8} {'factory':18} {'file B/vec':>10} {'RAM B/vec':>10} {'x Flat':>7} {'build s':>8}"
            "  recall@10 (params)"
        )
        for row in conv["rows"]:
            recall = ", ".join(
                f"{r['recall@10']:.3f}" + (f" ({r['search_params']})" if r["search_params"] else "")
                for r in row["recall"]
            )
            ratio = row["loaded_per_vector_bytes"] / flat["loaded_per_vector_bytes"]
            print(
                f"{row['target']:8} {row['factory']:18} {row['per_vector_bytes']:10.1f}"
                f" {row['loaded_per_vector_bytes']:10.1f} {ratio:7.3f} {row['seconds']:8.1f}  {recall}"
            )
    print(f"\n== wiki-18 ({WIKI18_PASSAGES:,} x {WIKI18_DIM}) ==")
    print(f"{'option':16} {'arithmetic GiB':>15} {'from measured B/vec':>20}")
    for row in wiki18_plan(conv):
        measured = f"{row['measured_gib']:.1f}" if "measured_gib" in row else "-"
        print(f"{row['option']:16} {row['arithmetic_gib']:15.1f} {measured:>20}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller indexes (50k replicas, 20k conversion)")
    parser.add_argument("--replica-n", type=int, default=200_000)
    parser.add_argument("--convert-n", type=int, default=100_000)
    parser.add_argument("--recall-queries", type=int, default=500)
    parser.add_argument("--skip-replicas", action="store_true")
    parser.add_argument("--skip-conversion", action="store_true")
    parser.add_argument(
        "--faiss-threads",
        type=int,
        default=1,
        help="OpenMP threads for training/adding"
        " (1: on a busy 2-core machine PQ96 training measured 26 s on 1 thread, 182 s on 2)",
    )
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    import faiss

    faiss.omp_set_num_threads(args.faiss_threads)
    if args.quick:
        args.replica_n, args.convert_n = 50_000, 20_000
    report: dict = {"load_average_start": os.getloadavg()[0], "faiss_threads": args.faiss_threads}
    with tempfile.TemporaryDirectory(prefix="index-memory-") as tmp:
        workdir = Path(tmp)
        if not args.skip_replicas:
            print(f"replicas: {args.replica_n} x 384 Flat, read vs mmap ...", flush=True)
            report["replicas"] = replica_section(workdir, args.replica_n)
        if not args.skip_conversion:
            print(f"conversion: {args.convert_n} x 768 ...", flush=True)
            report["conversion"] = conversion_section(workdir, args.convert_n, 768, args.recall_queries)
    report["load_average_end"] = os.getloadavg()[0]
    print_report(report)
    print(f"\nload average: {report['load_average_start']:.2f} at start, {report['load_average_end']:.2f} at end")
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
