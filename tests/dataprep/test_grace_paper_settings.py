"""``data grace`` as GRACE's authors build their data: multi-hop evidence as one joined reference, HotpotQA retrieved
among each question's own paragraphs with the split's counts printed, the SFT baseline's data (Appendix B.3) and the
three-shot baseline prompts (Table 4) -- on the bundled set and a HotpotQA-layout file."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from verl_evidence.dataprep import grace as grace_mod
from verl_evidence.dataprep.rows import grace_rows, read_parquet
from verl_evidence.dataprep.templates import load_template
from verl_evidence.rewards import grace as grace_reward

from .conftest import flat, invoke
from .test_grace import HOTPOT


def bundled_examples(retrievers=("oracle",)):
    from verl_evidence.bundled import corpus_path, qa_path
    from verl_evidence.dataprep.records import read_corpus, read_flashrag_jsonl
    from verl_evidence.dataprep.retrievers import build_retriever

    records = read_flashrag_jsonl(qa_path(), "bundled")
    corpus = read_corpus(corpus_path())
    built = [build_retriever(name, corpus, seed=0) for name in retrievers]
    examples, _ = grace_mod.construct([grace_mod.GraceInput(r) for r in records], built, corpus, k=5, seed=0)
    return examples, corpus


def test_bundled_two_hop_rows_score_one_hop_below_both() -> None:
    """The rows say their evidence is one evidence's sentences; the reward then joins them (the default) or takes
    the best sentence (``evidence_reference=per_sentence``)."""
    examples, corpus = bundled_examples()
    rows = grace_rows(examples, corpus, load_template("grace"), "train")
    two_hop = [
        row
        for row in rows
        if row["extra_info"]["answerable"] and len(row["reward_model"]["ground_truth"]["evidence"]) == 2
    ]
    assert len(two_hop) > 10 and all(row["extra_info"]["evidence_sentences"] is True for row in rows)
    for row in two_hop:
        truth, extra = row["reward_model"]["ground_truth"], row["extra_info"]
        first, second = truth["evidence"]
        one_hop = f"<evidence>{second}</evidence><answer>{truth['target'][0]}</answer>"
        both = f"<evidence>{first} {second}</evidence><answer>{truth['target'][0]}</answer>"
        joined_one = grace_reward.compute_score(row["data_source"], one_hop, truth, extra)
        joined_both = grace_reward.compute_score(row["data_source"], both, truth, extra)
        best_one = grace_reward.compute_score(
            row["data_source"], one_hop, truth, extra, evidence_reference="per_sentence"
        )
        assert joined_both["evidence_rouge"] == pytest.approx(1.0)
        assert joined_one["evidence_rouge"] < 0.95 and best_one["evidence_rouge"] == pytest.approx(1.0)
        assert joined_one["score"] < joined_both["score"]


def test_hotpotqa_retrieves_among_its_own_paragraphs_and_prints_the_split(tmp_path: Path) -> None:
    source = tmp_path / "hotpot.json"
    source.write_text(json.dumps(HOTPOT))
    own = {"h1": {"Paris", "Vienna", "Nile"}, "h2": {"Danube", "Vienna", "Paris"}}
    out = tmp_path / "test.parquet"
    args = ["grace", source, "--style", "hotpotqa", "--retriever", "bm25", "--split", "test", "--k", 4]
    result = invoke(*args, "-o", out)
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    for row in rows:  # a question's context holds its own paragraphs only (3 of them, though k = 4)
        assert set(row["extra_info"]["passage_ids"]) <= own[row["extra_info"]["id"]]
        assert row["extra_info"]["evidence_sentences"] is True
    answerable = sum(row["extra_info"]["answerable"] for row in rows)
    assert answerable == 2  # both questions' gold paragraphs are among their own three
    expected = f"split: {answerable} answerable : {len(rows) - answerable} unanswerable (GRACE Table 1"
    assert expected in flat(result.output) and "HotpotQA 296 : 204" in flat(result.output)

    result = invoke(*args, "--file-pool", "-o", out)  # the whole file's paragraphs: 4 per context
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    assert all(len(row["extra_info"]["passage_ids"]) == 4 for row in rows)
    assert any(not set(row["extra_info"]["passage_ids"]) <= own[row["extra_info"]["id"]] for row in rows)


def test_sft_baseline_data_from_the_bundled_set(tmp_path: Path) -> None:
    """B.3: the constructed training examples with rule-written targets; verl's SFT dataset trains on them."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    from verl_evidence.local.tiny_models import tiny_tokenizer

    out = tmp_path / "sft.parquet"
    result = invoke("grace", "bundled", "--retriever", "oracle", "--sft", "-o", out)
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    rows = table.to_pylist()
    examples, _ = bundled_examples()
    assert len(rows) == len(examples)
    assert {row["answerable"] for row in rows} == {True, False}
    by_key = {(e.record.id, e.retriever): e for e in examples}
    for row in rows:
        example = by_key[(row["id"], row["retriever"])]
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["system", "user", "assistant"]
        target = row["messages"][-1]["content"]
        if example.answerable:
            evidence = " ".join(example.record.gold_evidence)
            assert target == f"<evidence>{evidence}</evidence>\n<answer>{example.record.answers[0]}</answer>"
        else:
            assert target == "<llm>The question is unanswerable</llm>\n<answer>Unanswerable</answer>"
        assert grace_reward.structure_ok(target)
    summary = json.loads(Path(str(out).removesuffix(".parquet") + ".summary.json").read_text())
    assert summary["command"] == "data grace --sft" and summary["rows"] == len(rows)

    config = OmegaConf.create({"max_length": 4096, "truncation": "error", "pad_mode": "right"})
    dataset = MultiTurnSFTDataset(str(out), tiny_tokenizer(), config)
    item = dataset[0]
    trained = tiny_tokenizer().decode(item["input_ids"][item["loss_mask"].bool()])
    assert rows[0]["messages"][-1]["content"] in trained
    assert rows[0]["messages"][1]["content"] not in trained


def test_three_shot_baseline_prompts_are_selectable(tmp_path: Path) -> None:
    out = tmp_path / "three_shot.parquet"
    for name in ("grace_three_shot", "grace_three_shot_tags"):
        result = invoke("grace", "bundled", "--retriever", "oracle", "--template", name, "-o", out)
        assert result.exit_code == 0, result.output
        row = read_parquet(out)[0]
        prompt = row["prompt"]
        assert [m["role"] for m in prompt] == ["system", *["user", "assistant"] * 3, "user"]
        assert row["extra_info"]["question"] in prompt[-1]["content"]
        assert "Doc 1 (Title:" in prompt[-1]["content"]
        replies = [m["content"] for m in prompt if m["role"] == "assistant"]
        if name == "grace_three_shot":  # Table 4: two answered, one refused
            assert replies == ["North Sea.", "1820.", "I don't know."]
        else:  # the same in GRACE's tags: two <evidence> paths, one <llm> path, all well formed
            assert all(grace_reward.structure_ok(reply) for reply in replies)
            assert ["<evidence>" in reply for reply in replies] == [True, True, False]
    # Demonstrations are not SFT targets: verl's SFT dataset would train on them
    result = invoke("grace", "bundled", "--retriever", "oracle", "--template", "grace_three_shot", "--sft", "-o", out)
    assert result.exit_code != 0
    assert "--sft needs a prompt without assistant turns" in flat(result.output)
