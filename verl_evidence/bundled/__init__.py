"""The embedded default dataset shipped inside the package.

A small encyclopedia-style corpus written for this project, a QA set with gold
passages, verbatim gold evidence and topical distractors (one- and two-hop), and
reference model outputs for the demo. See ``README.md`` in this directory for the
formats and statistics; the formats are also listed in ``docs/data-contracts.md``.

Paths are resolved with :mod:`importlib.resources`, so they work from a source
checkout, an editable install and an installed wheel alike.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from retrieval_server.jsonl import read_jsonl

CORPUS_FILE = "corpus.jsonl"
QA_FILE = "qa.jsonl"
TRAJECTORIES_FILE = "trajectories.jsonl"


def _data_path(name: str) -> Path:
    path = Path(str(resources.files(__name__).joinpath(name)))
    if not path.is_file():
        raise FileNotFoundError(f"bundled data file {name!r} is missing from the package (looked at {path})")
    return path


def corpus_path() -> Path:
    """Path of ``corpus.jsonl``: ``{"id": "p0001", "contents": "Title\\ntext"}`` per line."""
    return _data_path(CORPUS_FILE)


def qa_path() -> Path:
    """Path of ``qa.jsonl``: questions with answers, gold passages, gold evidence and distractors."""
    return _data_path(QA_FILE)


def trajectories_path() -> Path:
    """Path of ``trajectories.jsonl``: reference model outputs over bundled questions for the demo."""
    return _data_path(TRAJECTORIES_FILE)


def load_corpus() -> list[dict[str, str]]:
    """All passages, in file order."""
    return read_jsonl(corpus_path())


def load_qa() -> list[dict[str, Any]]:
    """All QA records, in file order."""
    return read_jsonl(qa_path())


def load_trajectories() -> list[dict[str, Any]]:
    """All reference trajectories, in file order."""
    return read_jsonl(trajectories_path())


__all__ = [
    "corpus_path",
    "qa_path",
    "trajectories_path",
    "load_corpus",
    "load_qa",
    "load_trajectories",
]
