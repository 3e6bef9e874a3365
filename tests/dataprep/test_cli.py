"""``verl-evidence data ...`` end to end: parquet written, read back by verl's own RLHFDataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_evidence.dataprep.rows import read_parquet
from verl_evidence.dataprep.templates import format_passages

from .conftest import PASSAGES, QUESTIONS, invoke, write_jsonl


def verl_dataset(path: Path, tokenizer_dir: Path):
    """Load a prepared file exactly as the trainer does."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 4096,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "truncation": "error",
            "cache_dir": str(path.parent / "cache"),
        }
    )
    return RLHFDataset(str(path), AutoTokenizer.from_pretrained(tokenizer_dir), config)


def test_qa_rows_round_trip_through_verl(tiny_set, tokenizer_dir, tmp_path: Path) -> None:
    qa, _ = tiny_set
    out = tmp_path / "evinote.parquet"
    result = invoke("qa", qa, "--data-source", "bundled", "--method", "evinote", "--split", "test", "-o", out)
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    assert len(rows) == len(QUESTIONS)
    first = rows[0]
    assert first["data_source"] == "bundled" and first["ability"] == "fact-reasoning"
    assert first["agent_name"] == "evidence_search"
    assert first["prompt"][0]["role"] == "user"
    assert first["prompt"][0]["content"].endswith(f"Question: {QUESTIONS[0]['question']}")
    assert "<summary>" in first["prompt"][0]["content"]  # EviNote's packaged prompt
    assert first["reward_model"] == {
        "style": "rule",
        "ground_truth": {"target": ["Mediterranean Sea"], "evidence": [QUESTIONS[0]["gold_evidence"][0]]},
    }
    extra = first["extra_info"]
    assert (extra["index"], extra["split"], extra["id"], extra["question"]) == (
        0,
        "test",
        "q1",
        QUESTIONS[0]["question"],
    )
    assert extra["tools_kwargs"] == {"search": {"create_kwargs": {"question": QUESTIONS[0]["question"]}}}

    dataset = verl_dataset(out, tokenizer_dir)
    assert len(dataset) == len(QUESTIONS)
    item = dataset[1]
    assert item["raw_prompt"][0]["content"] == rows[1]["prompt"][0]["content"]
    assert item["agent_name"] == "evidence_search"
    assert item["tools_kwargs"]["search"]["create_kwargs"]["question"] == QUESTIONS[1]["question"]
    assert item["index"] == 1
    assert list(item["reward_model"]["ground_truth"]["target"]) == ["Seine", "the Seine"]


def test_search_r1_baseline_rows_from_the_bundled_set(tokenizer_dir, tmp_path: Path) -> None:
    from verl_evidence import bundled

    out = tmp_path / "search_r1.parquet"
    result = invoke("qa", "bundled", "-o", out)
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    expected = [json.loads(line) for line in Path(bundled.qa_path()).read_text().splitlines() if line.strip()]
    assert [r["extra_info"]["id"] for r in rows] == [q["id"] for q in expected]
    assert [r["reward_model"]["ground_truth"]["target"] for r in rows] == [q["golden_answers"] for q in expected]
    assert [r["reward_model"]["ground_truth"]["evidence"] for r in rows] == [q["gold_evidence"] for q in expected]
    assert {r["data_source"] for r in rows} == {"bundled"}
    assert len(verl_dataset(out, tokenizer_dir)) == len(expected)


def test_eviomni_rows_with_in_process_bm25(tiny_set, tokenizer_dir, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    qa, corpus = tiny_set
    out = tmp_path / "eviomni.parquet"
    result = invoke(
        "eviomni",
        qa,
        "--data-source",
        "bundled",
        "--retriever",
        "bm25",
        "--corpus",
        corpus,
        "--tokenizer",
        tokenizer_dir,
        "--topk",
        3,
        "-o",
        out,
    )
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for row in rows:
        passages = row["extra_info"]["passages"]
        assert len(passages) == 3 and all(PASSAGES[p["id"]] == p["contents"] for p in passages)
        text = format_passages([p["contents"] for p in passages])
        assert row["extra_info"]["eviomni_len_p"] == len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert text in row["prompt"][0]["content"]  # the same passages the policy sees
        assert row["agent_name"] == "eviomni" and "tools_kwargs" not in row["extra_info"]
    assert rows[4]["extra_info"]["passages"][0]["id"] == "p09"  # "Danube ... Black Sea" ranks first for q5
    dataset = verl_dataset(out, tokenizer_dir)
    assert dataset[0]["extra_info"]["eviomni_len_p"] == rows[0]["extra_info"]["eviomni_len_p"]


def test_eviomni_rows_from_a_passages_file(tiny_set, tokenizer_dir, tmp_path: Path) -> None:
    qa, _ = tiny_set
    passages = write_jsonl(
        tmp_path / "passages.jsonl",
        [
            {"id": q["id"], "passages": [PASSAGES[p] for p in q["gold_passage_ids"]] + ["Untitled text only"]}
            for q in QUESTIONS
        ],
    )
    out = tmp_path / "lear.parquet"
    result = invoke(
        "eviomni",
        qa,
        "--data-source",
        "bundled",
        "--passages-file",
        passages,
        "--method",
        "lear",
        "--tokenizer",
        tokenizer_dir,
        "-o",
        out,
    )
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    assert rows[1]["extra_info"]["method"] == "lear"
    assert [p["contents"] for p in rows[1]["extra_info"]["passages"]] == [
        PASSAGES["p03"],
        PASSAGES["p04"],
        "Untitled text only",
    ]
    short = write_jsonl(tmp_path / "short.jsonl", [{"id": "q1", "passages": ["x"]}])
    result = invoke(
        "eviomni",
        qa,
        "--data-source",
        "bundled",
        "--passages-file",
        short,
        "--tokenizer",
        tokenizer_dir,
        "-o",
        tmp_path / "x.parquet",
    )
    assert result.exit_code == 2 and "short.jsonl: no passages for question id(s) ['q2', 'q3'" in result.output


def test_grace_cli_prints_statistics(tiny_set, tmp_path: Path) -> None:
    from verl_evidence.local.tiny_models import tiny_nli_model

    qa, corpus = tiny_set
    reranker = tiny_nli_model(tmp_path / "reranker", id2label={0: "relevant"})  # a one-logit cross-encoder
    out = tmp_path / "grace.parquet"
    result = invoke(
        "grace",
        qa,
        "--corpus",
        corpus,
        "--k",
        3,
        "--seed",
        7,
        "--cross-encoder",
        reranker,
        "--rerank-depth",
        6,
        "--split",
        "test",
        "--construction",
        "balanced",  # a test split is built naturally unless told (test_grace_natural_test_set)
        "-o",
        out,
    )
    assert result.exit_code == 0, result.output
    for name in ("oracle", "bm25", "dense", "dense+rerank", "random", "total"):
        assert name in result.output
    rows = read_parquet(out)
    assert f"wrote {len(rows)} rows" in result.output
    answerable = [r for r in rows if r["reward_model"]["ground_truth"]["answerable"]]
    unanswerable = [r for r in rows if not r["reward_model"]["ground_truth"]["answerable"]]
    assert answerable and unanswerable
    by_id = {q["id"]: q for q in QUESTIONS}
    for row in rows:
        extra, truth = row["extra_info"], row["reward_model"]["ground_truth"]
        gold = set(by_id[extra["id"]]["gold_passage_ids"])
        assert len(extra["passage_ids"]) == 3
        assert (gold <= set(extra["passage_ids"])) == truth["answerable"] == extra["answerable"]
        assert truth["evidence"] == (by_id[extra["id"]]["gold_evidence"] if truth["answerable"] else [])
        assert extra["validate"] is True  # split "test": GRACE's validation weights
        assert row["agent_name"] == "single_turn_agent"
        assert format_passages([PASSAGES[p] for p in extra["passage_ids"]]) in row["prompt"][-1]["content"]
    contexts = [(r["extra_info"]["question"], tuple(r["extra_info"]["passage_ids"])) for r in rows]
    assert len(contexts) == len(set(contexts))


@pytest.mark.parametrize(
    "args, message",
    [
        (["qa", "{qa}", "-o", "{out}"], "pass --data-source NAME"),
        (["qa", "{qa}", "--data-source", "wikiqa", "-o", "{out}"], "unknown data source 'wikiqa'"),
        (["qa", "{tmp}/missing.jsonl", "--data-source", "nq", "-o", "{out}"], "missing.jsonl: no such file"),
        (["qa", "{tmp}/data.csv", "--data-source", "nq", "-o", "{out}"], "expected 'bundled', a .jsonl"),
        (["eviomni", "{qa}", "--data-source", "bundled", "--tokenizer", "{tok}", "-o", "{out}"], "exactly one of"),
        (["grace", "{qa}", "-o", "{out}"], "needs its corpus"),
        (["grace", "{qa}", "--corpus", "{corpus}", "--retriever", "tfidf", "-o", "{out}"], "unknown retriever 'tfidf'"),
        (["grace", "{qa}", "--corpus", "{corpus}", "--retriever", "dense+rerank", "-o", "{out}"], "--cross-encoder"),
        (
            ["grace", "{qa}", "--corpus", "{corpus}", "--retriever", "oracle", "--k", "1", "-o", "{out}"],
            "more gold passages than k=1",
        ),
    ],
)
def test_cli_errors_are_clear(tiny_set, tokenizer_dir, tmp_path: Path, args: list[str], message: str) -> None:
    qa, corpus = tiny_set
    values = {"qa": qa, "corpus": corpus, "out": tmp_path / "out.parquet", "tmp": tmp_path, "tok": tokenizer_dir}
    result = invoke(*[a.format(**values) for a in args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out.parquet").exists()  # nothing half-written


def test_grace_on_the_bundled_set(tmp_path: Path) -> None:
    from verl_evidence import bundled

    out = tmp_path / "grace.parquet"
    args = ["grace", "bundled", "--retriever", "oracle", "--retriever", "bm25", "--retriever", "random", "-o", out]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    questions = [json.loads(line) for line in Path(bundled.qa_path()).read_text().splitlines() if line.strip()]
    per_retriever = {
        name: [r for r in rows if r["extra_info"]["retriever"] == name] for name in ("oracle", "bm25", "random")
    }
    oracle = per_retriever["oracle"]  # first retriever: nothing to deduplicate against
    assert len(oracle) == len(questions)
    assert sum(r["extra_info"]["answerable"] for r in oracle) == (len(questions) + 1) // 2
    for name, kept in per_retriever.items():  # the printed table matches the file
        answerable = sum(r["extra_info"]["answerable"] for r in kept)
        counts = f"│ {answerable:>10} │ {len(kept) - answerable:>12} │"
        assert f"│ {name} " in result.output and counts in result.output
    assert invoke(*args[:-1], tmp_path / "again.parquet").exit_code == 0
    assert read_parquet(tmp_path / "again.parquet") == rows  # seeded: identical files


def test_grace_default_retrievers() -> None:
    from verl_evidence.dataprep.cli import default_retrievers

    assert default_retrievers(None) == ["oracle", "bm25", "dense", "random"]
    assert default_retrievers("/models/reranker") == ["oracle", "bm25", "dense", "dense+rerank", "random"]
    assert default_retrievers("/models/reranker", annotated=False) == ["bm25", "dense", "dense+rerank", "random"]
    assert default_retrievers("/models/reranker", natural=True) == ["dense"]  # the paper's test retriever


@pytest.mark.parametrize(
    "content, message",
    [
        (
            b'{"id": "q1", "question": {"text": "Who?"}, "golden_answers": ["x"]}\n',
            ":2: column 'question' must be a string",
        ),
        (b'{"id": "q1", "question": ["Who?"], "golden_answers": ["x"]}\n', ":2: column 'question' must be a string"),
        (b'{"id": "q1", "question": "Wh\xff?", "golden_answers": ["x"]}\n', ":2: not UTF-8 text (byte 0xff"),
        (b'{"id": null, "question": "Who?", "golden_answers": ["x"]}\n', ":2: column id is null"),
    ],
)
def test_qa_refuses_what_it_cannot_read(tmp_path: Path, content: bytes, message: str) -> None:
    """One line naming the file and line, exit 2, no output file (not even the writer's partial one)."""
    good = json.dumps({"id": "q0", "question": "Where?", "golden_answers": ["here"]}).encode() + b"\n"
    source = tmp_path / "bad.jsonl"
    source.write_bytes(good + content)
    out = tmp_path / "out" / "rows.parquet"
    result = invoke("qa", source, "--data-source", "nq", "-o", out)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {source}{message}"), result.output
    assert not out.parent.exists() or not any(out.parent.iterdir())
