"""A tiny QA set and corpus in the bundled layout (docs/data-contracts.md), written per test session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PASSAGES = {
    "p01": "Nile\nThe Nile flows north into the Mediterranean Sea. It is about 6,650 kilometres long.",
    "p02": "Amazon\nThe Amazon carries more water than any other river. It ends in the Atlantic Ocean.",
    "p03": "Paris\nParis is the capital of France. The Seine runs through the city.",
    "p04": "Seine\nThe Seine is a river in northern France. It flows into the English Channel.",
    "p05": "Everest\nMount Everest is the highest mountain above sea level. It lies in the Himalayas.",
    "p06": "Himalayas\nThe Himalayas separate the Indian subcontinent from the Tibetan Plateau.",
    "p07": "Tokyo\nTokyo is the capital of Japan. It was formerly called Edo.",
    "p08": "Edo\nEdo was the seat of the Tokugawa shogunate. It was renamed Tokyo in 1868.",
    "p09": "Danube\nThe Danube flows through ten countries and empties into the Black Sea.",
    "p10": "Vienna\nVienna is the capital of Austria and lies on the Danube.",
    "p11": "Kilimanjaro\nKilimanjaro is the highest mountain in Africa.",
    "p12": "Lake Tana\nLake Tana in Ethiopia is the source of the Blue Nile.",
}
QUESTIONS = [
    {
        "id": "q1",
        "question": "Into which sea does the Nile flow?",
        "golden_answers": ["Mediterranean Sea"],
        "hops": 1,
        "gold_passage_ids": ["p01"],
        "gold_evidence": ["The Nile flows north into the Mediterranean Sea."],
        "distractor_ids": ["p02", "p12"],
    },
    {
        "id": "q2",
        "question": "Which river runs through the capital of France?",
        "golden_answers": ["Seine", "the Seine"],
        "hops": 2,
        "gold_passage_ids": ["p03", "p04"],
        "gold_evidence": ["Paris is the capital of France.", "The Seine runs through the city."],
        "distractor_ids": ["p09", "p10"],
    },
    {
        "id": "q3",
        "question": "What is the highest mountain above sea level?",
        "golden_answers": ["Mount Everest"],
        "hops": 1,
        "gold_passage_ids": ["p05"],
        "gold_evidence": ["Mount Everest is the highest mountain above sea level."],
        "distractor_ids": ["p11", "p06"],
    },
    {
        "id": "q4",
        "question": "What was the former name of the capital of Japan?",
        "golden_answers": ["Edo"],
        "hops": 2,
        "gold_passage_ids": ["p07", "p08"],
        "gold_evidence": ["Tokyo is the capital of Japan.", "It was formerly called Edo."],
        "distractor_ids": ["p03"],
    },
    {
        "id": "q5",
        "question": "Into which sea does the Danube empty?",
        "golden_answers": ["Black Sea"],
        "hops": 1,
        "gold_passage_ids": ["p09"],
        "gold_evidence": ["The Danube flows through ten countries and empties into the Black Sea."],
        "distractor_ids": ["p10", "p01"],
    },
    {
        "id": "q6",
        "question": "Where does the Blue Nile begin?",
        "golden_answers": ["Lake Tana"],
        "hops": 1,
        "gold_passage_ids": ["p12"],
        "gold_evidence": ["Lake Tana in Ethiopia is the source of the Blue Nile."],
        "distractor_ids": ["p01"],
    },
]


def invoke(*args: object):
    """``verl-evidence data ARGS...`` in this process."""
    from typer.testing import CliRunner

    from verl_evidence.cli import app

    return CliRunner().invoke(app, ["data", *map(str, args)], catch_exceptions=False)


def flat(output: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(output.split())


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_set(tmp_path_factory) -> tuple[Path, Path]:
    """(qa.jsonl, corpus.jsonl) in the bundled layout."""
    root = tmp_path_factory.mktemp("tiny_set")
    qa = write_jsonl(root / "qa.jsonl", QUESTIONS)
    corpus = write_jsonl(root / "corpus.jsonl", [{"id": k, "contents": v} for k, v in PASSAGES.items()])
    return qa, corpus


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from verl_evidence.local.tiny_models import tiny_tokenizer

    directory = tmp_path_factory.mktemp("tokenizer")
    tiny_tokenizer().save_pretrained(directory)
    return directory
