"""Training data of EviOmni's QA generator (the separate reader of ``eval --reader``): (q, P) -> a, as chat rows.

The papers fine-tune Qwen2.5 with LoRA (rank 8) to predict the gold answer from the question and its retrieved
passages (and, for the Zero baseline, from the question alone). ``recipes/eviomni_reader_sft.sh`` trains it with
verl's SFT trainer on the rows written here:

    python -m verl_evidence.eval.paper_reader_data --rows data/eviomni/train.parquet \
        --out data/eviomni_reader/train.parquet
    python -m verl_evidence.eval.paper_reader_data --bundled --out /tmp/reader.parquet   # the bundled set, BM25 top 5

Each row is ``messages``: the reader prompt (``eviomni_reader`` by default, ``eviomni_closed_book`` for Zero) filled
with the question and the row's passages laid out as everywhere else, then the first gold answer as the assistant
turn, so the reader learns to answer in the shape ``eval --reader`` reads back.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from verl_evidence.prompts import check_placeholders, load_prompt, placeholders, render_prompt

__all__ = ["bundled_source_rows", "reader_rows", "write_reader_rows"]

READER_PROMPT = "eviomni_reader"


def reader_rows(rows: Iterable[dict[str, Any]], prompt: str = READER_PROMPT) -> list[dict[str, Any]]:
    """SFT rows (``messages``, ``data_source``, ``extra_info``) from EviOmni/LEAR rows (``extra_info.passages``)."""
    from verl_evidence.dataprep.templates import format_passages
    from verl_evidence.text.ground_truth import coerce_ground_truth

    template = load_prompt(prompt)
    check_placeholders(template, ["question"], name=f"reader prompt {prompt!r}")
    unknown = placeholders(template) - {"question", "document"}
    if unknown:
        raise ValueError(f"reader prompt {prompt!r} has placeholder(s) this data cannot fill: {sorted(unknown)}")
    out = []
    for index, row in enumerate(rows):
        extra = row.get("extra_info") or {}
        question = str(extra.get("question") or "").strip()
        golds = coerce_ground_truth((row.get("reward_model") or {}).get("ground_truth"))["target"]
        passages = [p["contents"] if isinstance(p, dict) else str(p) for p in extra.get("passages") or []]
        if not question or not golds:
            raise ValueError(f"row {index} ({extra.get('id', '?')}): no question or no gold answer to train on")
        if "document" in placeholders(template) and not passages:
            raise ValueError(f"row {index} ({extra.get('id', '?')}): no passages (write rows with `data eviomni`)")
        user = render_prompt(template.strip(), question=question, document=format_passages(passages))
        out.append(
            {
                "data_source": row.get("data_source", "unknown"),
                "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": golds[0]}],
                "extra_info": {"id": str(extra.get("id", index)), "question": question, "reader_prompt": prompt},
            }
        )
    return out


def bundled_source_rows(k: int = 5) -> list[dict[str, Any]]:
    """EviOmni rows of the bundled QA set with each question's top-``k`` BM25 passages (no server needed)."""
    from verl_evidence.dataprep import rows
    from verl_evidence.dataprep.records import bundled_paths, load_records, read_corpus
    from verl_evidence.dataprep.retrievers import Query, build_retriever
    from verl_evidence.dataprep.templates import load_template

    records = load_records("bundled", None, allow_new_source=False)
    corpus = read_corpus(bundled_paths()[1])
    ranked = build_retriever("bm25", corpus).retrieve([Query(r.id, r.question) for r in records], k)
    passages = [[{"id": i, "contents": corpus[i]} for i in ids] for ids in ranked]
    return rows.eviomni_rows(records, passages, load_template("eviomni"), "train", lambda text: len(text.split()))


def write_reader_rows(rows: Sequence[dict[str, Any]], out: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--rows", type=Path, nargs="+", help="EviOmni/LEAR rows (parquet or JSONL of `data eviomni`)")
    source.add_argument("--bundled", action="store_true", help="the bundled QA set with BM25 top-5 passages")
    parser.add_argument("--out", type=Path, required=True, help="the SFT parquet to write")
    parser.add_argument("--prompt", default=READER_PROMPT, help="reader prompt (eviomni_closed_book: Zero baseline)")
    args = parser.parse_args(argv)
    try:
        if args.bundled:
            source_rows = bundled_source_rows()
        else:
            from verl_evidence.eval.datasets import load_rows

            source_rows = [row for path in args.rows for row in load_rows(path)]
        written = reader_rows(source_rows, args.prompt)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    path = write_reader_rows(written, args.out)
    print(f"{len(written)} reader rows ({args.prompt}) -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
