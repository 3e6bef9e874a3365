"""The smoke runs' training data: the bundled set through the same ``verl-evidence data`` commands a user runs."""

from __future__ import annotations

from pathlib import Path

from verl_evidence.local.smoke.settings import SMOKE_TOPK, smoke_dir

DATA_KINDS = ("eviomni", "lear", "evinote", "search_r1", "grace")


def _cli(*args: str) -> None:
    """Run a ``verl-evidence`` command in-process (the same code path users run)."""
    from verl_evidence.cli import app

    app(list(args), standalone_mode=False)


def method_data(kind: str, tokenizer_dir: Path) -> Path:
    """The training parquet of one data preparation (:data:`DATA_KINDS`), from the bundled set (cached)."""
    if kind not in DATA_KINDS:
        raise ValueError(f"unknown smoke data {kind!r}; one of {', '.join(DATA_KINDS)}")
    out = smoke_dir() / "data" / f"{kind}.parquet"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.parquet")
    if kind in ("eviomni", "lear"):
        _cli(
            "data",
            "eviomni",
            "bundled",
            "-o",
            str(tmp),
            "--method",
            kind,
            "--tokenizer",
            str(tokenizer_dir),
            "--retriever",
            "bm25",
            "--corpus",
            "bundled",
            "--topk",
            str(SMOKE_TOPK),
        )
    elif kind in ("evinote", "search_r1"):
        _cli("data", "qa", "bundled", "-o", str(tmp), "--method", kind)
    else:
        _cli("data", "grace", "bundled", "-o", str(tmp), "--retriever", "bm25", "--k", str(SMOKE_TOPK))
    tmp.replace(out)
    return out


def read_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()
