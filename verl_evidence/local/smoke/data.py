"""The smoke runs' training data: the bundled set through the data-preparation functions ``verl-evidence data``
runs, with the settings the commands below would use (``tests/recipes/test_smoke_data.py`` checks they write
the same rows):

    verl-evidence data eviomni bundled --method {eviomni,lear} --tokenizer DIR --retriever bm25 --corpus bundled
    verl-evidence data qa bundled --method {evinote,search_r1}
    verl-evidence data grace bundled --retriever bm25 --k SMOKE_TOPK

Calling the functions, not the Typer app, keeps this package below the command line (which registers
``smoke``) instead of importing it back.
"""

from __future__ import annotations

from pathlib import Path

from verl_evidence.local.smoke.settings import SMOKE_TOPK, locked, smoke_dir

DATA_KINDS = ("eviomni", "lear", "evinote", "search_r1", "grace")
SPLIT = "train"


def method_data(kind: str, tokenizer_dir: Path) -> Path:
    """The training parquet of one data preparation (:data:`DATA_KINDS`), from the bundled set (cached)."""
    if kind not in DATA_KINDS:
        raise ValueError(f"unknown smoke data {kind!r}; one of {', '.join(DATA_KINDS)}")
    out = smoke_dir() / "data" / f"{kind}.parquet"
    if out.exists():
        return out
    # Built once under its own lock: callers in other threads or processes (a warm-up reading every family's rows,
    # the held-out rows) wait for it instead of writing the same temporary file at once.
    with locked(out):
        if out.exists():
            return out
        tmp = out.with_suffix(".tmp.parquet")
        if kind in ("eviomni", "lear"):
            _eviomni_data(kind, tokenizer_dir, tmp)
        elif kind in ("evinote", "search_r1"):
            _search_data(kind, tmp)
        else:
            _grace_data(tmp)
        tmp.replace(out)
    return out


def _eviomni_data(method: str, tokenizer_dir: Path, path: Path) -> None:
    """The top ``SMOKE_TOPK`` BM25 passages of the bundled corpus in each prompt, L_P counted by the policy's
    tokenizer."""
    from verl_evidence.dataprep import rows
    from verl_evidence.dataprep.cli import token_counter
    from verl_evidence.dataprep.records import bundled_paths, load_records, read_corpus
    from verl_evidence.dataprep.retrievers import Query, build_retriever
    from verl_evidence.dataprep.templates import load_template

    records = load_records("bundled", None, allow_new_source=False)
    pool = read_corpus(bundled_paths()[1])
    ranked = build_retriever("bm25", pool).retrieve([Query(r.id, r.question) for r in records], SMOKE_TOPK)
    passages = [[{"id": i, "contents": pool[i]} for i in ids] for ids in ranked]
    written = rows.eviomni_rows(
        records, passages, load_template(method), SPLIT, token_counter(str(tokenizer_dir)), method
    )
    rows.write_parquet(written, path)


def _search_data(method: str, path: Path) -> None:
    """The question-only rows of the searching methods."""
    from verl_evidence.dataprep import rows
    from verl_evidence.dataprep.records import load_records
    from verl_evidence.dataprep.templates import load_template

    records = load_records("bundled", None, allow_new_source=False)
    with rows.RowWriter(path, rows.search_row_schema()) as writer:
        writer.write(rows.search_rows(records, method, load_template(method), SPLIT))


def _grace_data(path: Path) -> None:
    """GRACE's balanced construction over the bundled set with one retriever, BM25."""
    from verl_evidence.dataprep import grace, rows
    from verl_evidence.dataprep.records import bundled_paths, check_references, read_corpus, read_flashrag_jsonl
    from verl_evidence.dataprep.retrievers import build_retriever
    from verl_evidence.dataprep.templates import load_template

    qa_path, corpus_path = bundled_paths()
    records = read_flashrag_jsonl(qa_path, "bundled")
    passages = read_corpus(corpus_path)
    check_references(records, passages, str(qa_path))
    retriever = build_retriever("bm25", passages, corpus_name=str(corpus_path))
    examples, _ = grace.construct([grace.GraceInput(r) for r in records], [retriever], passages, SMOKE_TOPK)
    rows.write_parquet(rows.grace_rows(examples, passages, load_template("grace"), SPLIT), path)


def read_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()
