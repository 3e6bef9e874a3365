"""The smoke runs' data comes from the data-preparation functions, row for row what the documented
``verl-evidence data`` commands write, and the smoke package never imports the command line back."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import verl_evidence
from verl_evidence.cli import app
from verl_evidence.local.smoke.data import DATA_KINDS, method_data
from verl_evidence.local.smoke.settings import SMOKE_TOPK
from verl_evidence.local.tiny_models import save_tiny_tokenizer

PACKAGE = Path(verl_evidence.__file__).parent


def cli_command(kind: str, out: Path, tokenizer: Path) -> list[str]:
    if kind in ("eviomni", "lear"):
        return ["data", "eviomni", "bundled", "-o", str(out), "--method", kind, "--tokenizer", str(tokenizer),
                "--retriever", "bm25", "--corpus", "bundled", "--topk", str(SMOKE_TOPK)]  # fmt: skip
    if kind in ("evinote", "search_r1"):
        return ["data", "qa", "bundled", "-o", str(out), "--method", kind]
    return ["data", "grace", "bundled", "-o", str(out), "--retriever", "bm25", "--k", str(SMOKE_TOPK)]


@pytest.mark.parametrize("kind", DATA_KINDS)
def test_smoke_data_is_what_the_data_command_writes(kind: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("VERL_EVIDENCE_SMOKE_DIR", str(tmp_path / "smoke"))
    tokenizer = save_tiny_tokenizer(tmp_path / "tokenizer")
    ours = pq.read_table(method_data(kind, tokenizer))
    app(cli_command(kind, tmp_path / "cli.parquet", tokenizer), standalone_mode=False)
    theirs = pq.read_table(tmp_path / "cli.parquet")
    assert ours.num_rows > 0
    assert ours.schema == theirs.schema
    assert ours.to_pylist() == theirs.to_pylist()


def test_the_smoke_package_does_not_import_the_command_line() -> None:
    """verl_evidence.cli registers `smoke`; an import of it from verl_evidence/local would be a cycle."""
    offenders = []
    for path in (PACKAGE / "local").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            if "verl_evidence.cli" in names or any(n.startswith("verl_evidence.cli.") for n in names):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not offenders, offenders


def test_threads_asking_for_the_same_rows_at_once_build_them_once(tmp_path: Path, monkeypatch) -> None:
    """The learning benchmark prepares two warm-ups in two threads, and both read every family's rows (the held-out
    split skips every warm-up question): the second waits for the first's file instead of writing the same temporary
    file at once (a protocol run died on that: FileNotFoundError on search_r1.tmp.parquet)."""
    import threading
    import time

    from verl_evidence.local.smoke import data

    monkeypatch.setenv("VERL_EVIDENCE_SMOKE_DIR", str(tmp_path / "smoke"))
    builds = []
    real_search_data = data._search_data

    def slow_search_data(kind: str, path: Path) -> None:
        builds.append(kind)
        time.sleep(0.3)  # both threads inside the build at once, were it not locked
        real_search_data(kind, path)

    monkeypatch.setattr(data, "_search_data", slow_search_data)
    found, errors = [], []

    def ask() -> None:
        try:
            found.append(method_data("search_r1", tmp_path / "unused-tokenizer"))
        except Exception as error:  # the assertion below names it
            errors.append(error)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and builds == ["search_r1"], (errors, builds)
    assert len(set(found)) == 1 and pq.read_table(found[0]).num_rows > 0
