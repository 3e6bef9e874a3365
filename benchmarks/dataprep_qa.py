"""``data qa`` on a Search-R1 train file of full size: streaming against reading the whole file at once.

Search-R1's merged NQ + HotpotQA train file (``qa_search_train_merge.py --data_sources nq,hotpotqa``)
has 79,168 + 90,447 = 169,615 rows; its HotpotQA rows carry FlashRAG's ``metadata`` with the question's
ten context paragraphs. This writes a file of that schema and size (``benchmarks/search_r1_files.py``,
context paragraphs of generated sentences, ~4 sentences of ~25 words each) and runs, each in a fresh
process:

- ``streaming``: ``verl-evidence data qa FILE -o OUT`` as a user runs it (record batches of the needed
  columns in, batches out);
- ``whole file``: the baseline, the same rows built the way ``data qa`` did before: the whole table
  read and turned into Python rows (every column), all output rows built, then written at once;
- ``import only``: the interpreter with the CLI imported and nothing read, the floor under both (both
  runs import ``verl_evidence.cli``).

Reports wall and CPU seconds and peak RSS (``ru_maxrss`` of the child) and checks the two outputs hold
the same rows. Targets: streaming peak RSS <= 0.5 x the baseline's, CPU time <= 1.2 x (CPU, not wall:
the machine may be shared).

    python benchmarks/dataprep_qa.py [--nq 79168] [--hotpotqa 90447] [--work-dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

# Beside this script (benchmarks/ is on sys.path when it runs); the dataprep tests load it too.
from search_r1_files import HOTPOTQA_METADATA, search_r1_row, search_r1_schema

REPO = Path(__file__).resolve().parents[1]

NQ_TRAIN_ROWS = 79_168
HOTPOTQA_TRAIN_ROWS = 90_447
TARGET_RSS_RATIO = 0.5
TARGET_TIME_RATIO = 1.2
_TEXT = (
    "the river city was founded in by an early settler who built a mill on its banks and later "
    "the town grew into a regional centre of trade with a railway station opened in the century"
)
_WORDS = _TEXT.split()

STREAMING = """
import sys
from verl_evidence.cli import app
app(["data", "qa", sys.argv[1], "-o", sys.argv[2]])
"""
WHOLE_FILE = """
import sys
import pyarrow.parquet as pq
import verl_evidence.cli  # the same imports as the streaming run: the floor is shared
from verl_evidence.dataprep.records import SourceRow, question_id, record_from_row, check_unique_ids, GIVEN_COLUMNS
from verl_evidence.dataprep.rows import search_row, write_parquet
from verl_evidence.dataprep.templates import load_template

rows = pq.read_table(sys.argv[1]).to_pylist()
items = []
for number, row in enumerate(rows, start=1):
    row["id"] = question_id(row, row["data_source"], f"row {number}")
    items.append(SourceRow(record_from_row(row, f"row {number}", row["data_source"]),
                           {c: row[c] for c in GIVEN_COLUMNS}))
check_unique_ids([item.record for item in items], sys.argv[1])
template = load_template("search_r1")
write_parquet([search_row(item, "search_r1", template, i, None) for i, item in enumerate(items)], sys.argv[2])
"""
IMPORT_ONLY = """
import verl_evidence.cli, verl_evidence.dataprep.rows
"""


def _sentence(n: int, j: int) -> str:
    words = [_WORDS[(n * 31 + j * 7 + k * 3) % len(_WORDS)] for k in range(25)]
    return " ".join(words).capitalize() + f" {n}.{j}."


def _examples(data_source: str, start: int, stop: int) -> list[dict]:
    examples = []
    for n in range(start, stop):
        example = {
            "id": f"train_{n}",
            "question": f"{data_source} benchmark question {n} about the river city",
            "golden_answers": [f"answer {n}"],
        }
        if data_source == "hotpotqa":
            titles = [f"Title {n} {p}" for p in range(10)]
            example["metadata"] = {
                "type": "bridge",
                "level": "medium",
                "supporting_facts": {"title": titles[:2], "sent_id": [0, 1]},
                "context": {
                    "title": titles,
                    "sentences": [[_sentence(n, p * 4 + s) for s in range(4)] for p in range(10)],
                },
            }
        examples.append(example)
    return examples


def write_train_file(path: Path, nq: int, hotpotqa: int) -> None:
    """The merged file, written 1000 rows at a time (its row groups, as ``datasets.to_parquet`` writes)."""
    schema = search_r1_schema(HOTPOTQA_METADATA)
    with pq.ParquetWriter(path, schema) as writer:
        for data_source, count in (("nq", nq), ("hotpotqa", hotpotqa)):
            for start in range(0, count, 1000):
                examples = _examples(data_source, start, min(count, start + 1000))
                rows = [search_r1_row(e, data_source, "train", start + i) for i, e in enumerate(examples)]
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))


def run_child(code: str, *args: str) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of ``python -c code args`` in a fresh process.

    A child's ``ru_maxrss`` includes what it held before ``exec``, i.e. the parent's resident set at
    fork: the parent therefore never loads the data (the file is written by a child too).
    """
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child failed ({status}): {code.strip().splitlines()[-1]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def same_rows(a: Path, b: Path) -> bool:
    batches_a = pq.ParquetFile(a).iter_batches(batch_size=4096)
    batches_b = pq.ParquetFile(b).iter_batches(batch_size=4096)
    return all(x.to_pylist() == y.to_pylist() for x, y in zip(batches_a, batches_b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nq", type=int, default=NQ_TRAIN_ROWS)
    parser.add_argument("--hotpotqa", type=int, default=HOTPOTQA_TRAIN_ROWS)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the files written")
    parser.add_argument("--write-only", type=Path, default=None, help=argparse.SUPPRESS)  # the writer child
    args = parser.parse_args()
    console = Console()
    if args.write_only:
        write_train_file(args.write_only, args.nq, args.hotpotqa)
        return
    work = Path(tempfile.mkdtemp(prefix="dataprep_qa_", dir=args.work_dir))
    try:
        source = work / "train.parquet"
        started = time.perf_counter()
        writer = [sys.executable, __file__, "--nq", str(args.nq), "--hotpotqa", str(args.hotpotqa)]
        subprocess.run([*writer, "--write-only", str(source)], check=True)
        metadata = pq.ParquetFile(source).metadata
        in_memory = sum(metadata.row_group(g).total_byte_size for g in range(metadata.num_row_groups)) / 2**20
        console.print(
            f"wrote {metadata.num_rows:,} rows in {time.perf_counter() - started:.0f} s: "
            f"{source.stat().st_size / 2**20:.0f} MiB on disk, {in_memory:.0f} MiB uncompressed"
        )
        results = {
            "import only": run_child(IMPORT_ONLY),
            "whole file (baseline)": run_child(WHOLE_FILE, str(source), str(work / "whole.parquet")),
            "streaming (data qa)": run_child(STREAMING, str(source), str(work / "streaming.parquet")),
        }
        identical = same_rows(work / "whole.parquet", work / "streaming.parquet")
        _, base_cpu, base_rss = results["whole file (baseline)"]
        table = Table(title=f"data qa on {args.nq + args.hotpotqa:,} Search-R1 rows")
        for column in ("run", "wall s", "CPU s", "peak RSS MiB", "CPU vs baseline", "RSS vs baseline"):
            table.add_column(column, justify="left" if column == "run" else "right")
        for name, (wall, cpu, rss) in results.items():
            table.add_row(
                name, f"{wall:.1f}", f"{cpu:.1f}", f"{rss:.0f}", f"{cpu / base_cpu:.2f}", f"{rss / base_rss:.2f}"
            )
        console.print(table)
        _, cpu, rss = results["streaming (data qa)"]
        console.print(
            f"outputs identical: {identical}; targets: RSS ratio <= {TARGET_RSS_RATIO} "
            f"({'met' if rss / base_rss <= TARGET_RSS_RATIO else 'MISSED'}), CPU ratio <= {TARGET_TIME_RATIO} "
            f"({'met' if cpu / base_cpu <= TARGET_TIME_RATIO else 'MISSED'}); wall time depends on the machine's load"
        )
        if not identical:
            raise SystemExit("the streaming and whole-file outputs differ")
    finally:
        if args.keep:
            console.print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
