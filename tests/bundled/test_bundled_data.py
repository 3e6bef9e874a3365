"""The bundled corpus and QA set are well formed, consistent with each other, and retrievable."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from verl_evidence import bundled
from verl_evidence.rewards.qa_metrics import normalize

# Same boundary the passages were written to: a sentence ends at . ! ? followed by a capital, digit or quote.
SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'])")


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return bundled.load_corpus()


@pytest.fixture(scope="module")
def passages(corpus: list[dict]) -> dict[str, str]:
    return {row["id"]: row["contents"] for row in corpus}


@pytest.fixture(scope="module")
def qa() -> list[dict]:
    return bundled.load_qa()


def _body(contents: str) -> str:
    return contents.split("\n", 1)[1]


@pytest.mark.parametrize("path_fn", [bundled.corpus_path, bundled.qa_path])
def test_every_line_is_a_json_object(path_fn) -> None:
    lines = path_fn().read_text(encoding="utf-8").splitlines()
    assert lines, f"{path_fn()} is empty"
    for number, line in enumerate(lines, start=1):
        assert line.strip(), f"blank line {number} in {path_fn()}"
        assert isinstance(json.loads(line), dict), f"line {number} of {path_fn()} is not an object"


def test_corpus_size_ids_and_shape(corpus: list[dict]) -> None:
    assert len(corpus) >= 300
    ids = [row["id"] for row in corpus]
    assert len(set(ids)) == len(ids), [i for i, n in Counter(ids).items() if n > 1]
    for row in corpus:
        assert set(row) == {"id", "contents"}, row["id"]
        assert re.fullmatch(r"p\d{4}", row["id"]), row["id"]
        title, sep, text = row["contents"].partition("\n")
        assert sep and title.strip() == title and title, f"{row['id']}: contents is not 'Title\\ntext'"
        assert "\n" not in text, f"{row['id']}: text spans several lines"
        assert 60 <= len(text.split()) <= 120, f"{row['id']}: {len(text.split())} words"
        assert 3 <= len(SENTENCE_BOUNDARY.split(text)) <= 6, f"{row['id']}: sentence count out of range"


def test_corpus_titles_are_unique(corpus: list[dict]) -> None:
    titles = Counter(row["contents"].split("\n", 1)[0] for row in corpus)
    assert [t for t, n in titles.items() if n > 1] == []


def test_qa_size_and_two_hop_share(qa: list[dict]) -> None:
    assert len(qa) >= 100
    two_hop = sum(1 for row in qa if row["hops"] == 2)
    assert two_hop * 3 >= len(qa), f"only {two_hop} of {len(qa)} questions are two-hop"


def test_qa_ids_unique_and_fields_typed(qa: list[dict]) -> None:
    ids = [row["id"] for row in qa]
    assert len(set(ids)) == len(ids)
    for row in qa:
        assert set(row) == {
            "id",
            "question",
            "golden_answers",
            "hops",
            "gold_passage_ids",
            "gold_evidence",
            "distractor_ids",
        }, row["id"]
        assert re.fullmatch(r"q\d{3}", row["id"]), row["id"]
        assert row["question"].strip().endswith("?"), row["id"]
        assert row["hops"] in (1, 2), row["id"]
        assert len(row["gold_passage_ids"]) == row["hops"], row["id"]
        assert len(set(row["gold_passage_ids"])) == len(row["gold_passage_ids"]), row["id"]
        assert 1 <= len(row["gold_evidence"]) <= 3, row["id"]
        assert 3 <= len(row["distractor_ids"]) <= 5, row["id"]
        assert row["golden_answers"] and all(isinstance(a, str) and a.strip() for a in row["golden_answers"]), row["id"]
        assert len(row["golden_answers"][0].split()) <= 8, f"{row['id']}: answer is not short"


def test_every_referenced_passage_exists(qa: list[dict], passages: dict[str, str]) -> None:
    missing = [
        (row["id"], pid) for row in qa for pid in row["gold_passage_ids"] + row["distractor_ids"] if pid not in passages
    ]
    assert missing == []


def test_gold_evidence_is_verbatim_from_gold_passages(qa: list[dict], passages: dict[str, str]) -> None:
    for row in qa:
        gold_texts = [_body(passages[pid]) for pid in row["gold_passage_ids"]]
        for sentence in row["gold_evidence"]:
            assert any(sentence in text for text in gold_texts), f"{row['id']}: {sentence!r} not in a gold passage"
        # every gold passage contributes evidence: a two-hop question needs both hops
        for pid, text in zip(row["gold_passage_ids"], gold_texts):
            assert any(sentence in text for sentence in row["gold_evidence"]), f"{row['id']}: {pid} gives no evidence"


def test_answer_appears_in_gold_evidence(qa: list[dict]) -> None:
    for row in qa:
        evidence = normalize(" ".join(row["gold_evidence"]))
        assert normalize(row["golden_answers"][0]) in evidence, f"{row['id']}: answer not in its evidence"


def test_distractors_are_not_gold_and_hold_no_answer(qa: list[dict], passages: dict[str, str]) -> None:
    for row in qa:
        assert not set(row["distractor_ids"]) & set(row["gold_passage_ids"]), row["id"]
        assert len(set(row["distractor_ids"])) == len(row["distractor_ids"]), row["id"]
        for pid in row["distractor_ids"]:
            text = passages[pid]
            assert not any(sentence in text for sentence in row["gold_evidence"]), f"{row['id']}: {pid}"
            normalized = normalize(text)
            assert not any(normalize(a) in normalized for a in row["golden_answers"]), (
                f"{row['id']}: {pid} holds the answer"
            )


def test_two_hop_gold_passages_are_distinct_entities(qa: list[dict], passages: dict[str, str]) -> None:
    for row in qa:
        if row["hops"] == 2:
            titles = {passages[pid].split("\n", 1)[0] for pid in row["gold_passage_ids"]}
            assert len(titles) == 2, row["id"]


@pytest.mark.slow  # the real MiniLM index of the bundled corpus (built once per machine, shared with the server tests)
def test_minilm_recall_at_5_on_one_hop_questions(qa: list[dict], bundled_index_dir) -> None:
    """Sanity check that questions are worded so a dense retriever can find their gold passage: the index the
    server searches (the corpus encoded with the packaged MiniLM), queried as the server queries it."""
    from retrieval_server.config import ServerConfig
    from retrieval_server.search import Retriever

    retriever = Retriever(ServerConfig(index_dir=bundled_index_dir, method="dense"))
    one_hop = [row for row in qa if row["hops"] == 1]
    questions = [row["question"] for row in one_hop]
    rows, _ = retriever.search(questions, retriever.encode(questions), 5)
    top5 = [{doc["id"] for doc in retriever.lookup(found[found >= 0])} for found in rows]
    hits = [row["gold_passage_ids"][0] in top for row, top in zip(one_hop, top5)]
    recall = sum(hits) / len(hits)
    print(f"MiniLM recall@5 of the gold passage over {len(one_hop)} one-hop questions: {recall:.3f}")
    assert recall >= 0.6


# ---------------------------------------------------------------- trajectories

GOOD_CASES = {"well_grounded", "note_taking", "correct_refusal"}
BAD_CASES = {"unsupported", "wrong_refusal", "bad_format"}


@pytest.fixture(scope="module")
def trajectories() -> list[dict]:
    return bundled.load_trajectories()


def test_trajectories_schema_and_references(trajectories: list[dict], qa: list[dict], passages: dict[str, str]) -> None:
    questions = {row["id"]: row for row in qa}
    ids = [t["id"] for t in trajectories]
    assert len(set(ids)) == len(ids)
    for t in trajectories:
        assert t["question_id"] in questions, t["id"]
        assert t["method"] in {"evinote", "eviomni", "grace"}, t["id"]
        assert isinstance(t["case"], str) and t["case"], t["id"]
        if t["method"] == "evinote":
            turns = t["turns"]
            assert turns and all(isinstance(x, str) for x in turns), t["id"]
            assert all(x.rstrip().endswith("</search>") for x in turns[:-1]), (
                f"{t['id']}: a middle turn must end in a search"
            )
            assert "<information>" not in "".join(turns), f"{t['id']}: retrieval is the system's, not the policy's"
            assert turns[-1].rstrip().endswith("</answer>"), t["id"]
        elif t["method"] == "eviomni":
            assert isinstance(t["response"], str) and isinstance(t["answer_r"], str) and isinstance(t["answer_e"], str)
        else:
            gold = set(questions[t["question_id"]]["gold_passage_ids"])
            assert all(pid in passages for pid in t["passage_ids"]), t["id"]
            assert t["answerable"] == gold.issubset(t["passage_ids"]), (
                f"{t['id']}: answerable label disagrees with its context"
            )
            if not t["answerable"]:
                assert not gold & set(t["passage_ids"]), f"{t['id']}: an unanswerable context holds a gold passage"


def test_every_method_covers_good_and_bad_behaviour(trajectories: list[dict]) -> None:
    cases: dict[str, set[str]] = {}
    for t in trajectories:
        cases.setdefault(t["method"], set()).add(t["case"])
    assert {"well_grounded", "unsupported", "bad_format"} <= cases["evinote"] & cases["eviomni"] & cases["grace"]
    assert {"wrong_refusal", "correct_refusal"} <= cases["grace"]
    assert {"note_taking", "no_notes"} <= cases["evinote"]


def test_grace_reward_separates_reference_cases(trajectories: list[dict], qa: list[dict]) -> None:
    from verl_evidence.rewards import grace

    questions = {row["id"]: row for row in qa}
    expected = {"correct_refusal": 1.5, "wrong_refusal": 0.5, "unsupported": 0.5, "bad_format": 0.0}
    good, bad = [], []
    for t in (t for t in trajectories if t["method"] == "grace"):
        q = questions[t["question_id"]]
        result = grace.score(t["response"], q["golden_answers"], q["gold_evidence"], t["answerable"])
        if t["case"] in expected:
            assert result["score"] == pytest.approx(expected[t["case"]]), t["id"]
        else:  # well grounded: right path, quoted gold evidence (ROUGE-L is max over single references), correct answer
            assert result["path"] > 0 and result["evidence_rouge"] > 0.6, t["id"]
            assert result["answer_rouge"] == pytest.approx(1.0), t["id"]
        (good if t["case"] in GOOD_CASES else bad).append(result["score"])
    assert min(good) > max(bad)


def test_evinote_reward_separates_reference_cases(trajectories: list[dict], qa: list[dict]) -> None:
    from verl_evidence.rewards import evinote

    questions = {row["id"]: row for row in qa}
    # EQR comes from the NLI judge at training time; 0 here isolates the gate.
    expected = {"well_grounded": 1.0, "note_taking": 1.0, "unsupported": 0.1, "no_notes": 0.0, "bad_format": 0.0}
    for t in (t for t in trajectories if t["method"] == "evinote"):
        response = "\n\n<information>(retrieved passages)</information>\n\n".join(t["turns"])
        result = evinote.score(response, questions[t["question_id"]]["golden_answers"], eqr=0.0)
        assert result["score"] == pytest.approx(expected[t["case"]]), t["id"]


def test_eviomni_reward_separates_reference_cases(
    trajectories: list[dict], qa: list[dict], passages: dict[str, str]
) -> None:
    from verl_evidence.rewards import eviomni

    questions = {row["id"]: row for row in qa}
    good, bad = [], []
    for t in (t for t in trajectories if t["method"] == "eviomni"):
        q = questions[t["question_id"]]
        shown = [passages[pid] for pid in q["gold_passage_ids"] + q["distractor_ids"]]
        extra = {"eviomni_answer_r": t["answer_r"], "eviomni_answer_e": t["answer_e"], "passages": "\n".join(shown)}
        result = eviomni.compute_score("bundled", t["response"], {"target": q["golden_answers"]}, extra)
        if t["case"] == "well_grounded":
            assert result["ans"] == pytest.approx(1.0) and result["format"] == 1.0, t["id"]
        if t["case"] == "bad_format":
            assert result["format"] == 0.0, t["id"]
        (good if t["case"] in GOOD_CASES else bad).append(result["score"])
    assert min(good) > max(bad)


def test_trajectories_load_through_the_replay_reader(trajectories: list[dict]) -> None:
    from verl_evidence.eval.replay import load_trajectories

    loaded = load_trajectories(bundled.trajectories_path())
    assert [t["id"] for t in loaded] == [t["id"] for t in trajectories]
    assert {t["rollout"] for t in loaded} == {"search", "eviomni", "grace"}
