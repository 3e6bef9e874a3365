"""GRACE construction: invariants property-tested, retrievers and input styles tested on small data."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_evidence.dataprep.grace import (
    GraceInput,
    answer_sentences,
    construct,
    contains_answer,
    make_insufficient,
    make_sufficient,
    read_hotpotqa,
    read_qasper,
    split_sufficient,
)
from verl_evidence.dataprep.records import DataPrepError, QARecord
from verl_evidence.dataprep.retrievers import BM25Retriever, OracleRetriever, Query, RandomRetriever

from .conftest import PASSAGES, QUESTIONS

IDS = [f"d{i}" for i in range(30)]


def is_subsequence(part: list[str], whole: list[str]) -> bool:
    iterator = iter(whole)
    return all(item in iterator for item in part)


@st.composite
def ranked_and_gold(draw):
    k = draw(st.integers(1, 8))
    ranked = draw(st.lists(st.sampled_from(IDS), min_size=k, max_size=k, unique=True))
    gold = draw(st.lists(st.sampled_from(IDS), min_size=1, max_size=k, unique=True))
    return ranked, gold, k


@given(ranked_and_gold())
def test_sufficient_context_invariants(case) -> None:
    ranked, gold, k = case
    context = make_sufficient(ranked, gold, k)
    assert len(context) == k and len(set(context)) == k
    assert set(gold) <= set(context)
    kept = [p for p in context if p in ranked]
    assert is_subsequence(kept, ranked)  # retrieved passages keep their order
    missing = [g for g in gold if g not in ranked]
    assert context[len(context) - len(missing) :] == missing  # forced-in gold take the lowest ranks
    if not missing:
        assert context == ranked  # nothing to force in: the retrieval is untouched
    # only the lowest-ranked non-gold passages were replaced
    dropped = [p for p in ranked if p not in context]
    assert len(dropped) == len(missing) and not set(dropped) & set(gold)
    kept_non_gold = [ranked.index(p) for p in kept if p not in gold]
    if dropped and kept_non_gold:
        assert max(kept_non_gold) < min(ranked.index(p) for p in dropped)


@given(ranked_and_gold(), st.lists(st.sampled_from(IDS), max_size=40))
def test_insufficient_context_invariants(case, fillers) -> None:
    ranked, gold, k = case
    pool = fillers + IDS  # always enough non-gold passages
    context = make_insufficient(ranked, gold, pool, k)
    assert len(context) == k and len(set(context)) == k
    assert not set(context) & set(gold)
    retained = [p for p in ranked if p not in gold]
    assert context[: len(retained)] == retained  # surviving retrieved passages first, in order


def test_insufficient_fails_when_fillers_run_out() -> None:
    with pytest.raises(DataPrepError, match="not enough non-gold passages"):
        make_insufficient(["g", "a"], ["g"], ["g", "a"], 2)


def test_sufficient_refuses_more_gold_than_k() -> None:
    with pytest.raises(DataPrepError, match="smaller than the number of gold passages"):
        make_sufficient(["a"], ["g1", "g2"], 1)


@given(st.integers(0, 200), st.integers(0, 10_000), st.text(min_size=1, max_size=12))
def test_split_is_balanced_and_seeded(count, seed, retriever) -> None:
    chosen = split_sufficient(count, seed, retriever)
    assert len(chosen) - (count - len(chosen)) in (0, 1)
    assert chosen <= set(range(count))
    assert chosen == split_sufficient(count, seed, retriever)


def test_split_differs_between_retrievers() -> None:
    splits = {frozenset(split_sufficient(100, 0, name)) for name in ("oracle", "bm25", "dense", "random")}
    assert len(splits) == 4


class ListRetriever:
    """A retriever returning fixed rankings (drawn by hypothesis): construction must not care how they came."""

    def __init__(self, name: str, rankings: dict[str, list[str]]) -> None:
        self.name = name
        self.rankings = rankings

    def retrieve(self, queries, k):
        return [self.rankings[q.id][:k] for q in queries]


@st.composite
def grace_problem(draw):
    k = draw(st.integers(2, 5))
    corpus = {pid: f"T{pid}\ntext {pid}" for pid in IDS}
    n = draw(st.integers(1, 8))
    items = []
    for i in range(n):
        gold = draw(st.lists(st.sampled_from(IDS), min_size=1, max_size=min(2, k), unique=True))
        distractors = draw(st.lists(st.sampled_from([p for p in IDS if p not in gold]), max_size=4, unique=True))
        # two samples may share a question: dedup is on (question, context), not on the id
        question = draw(st.sampled_from(["q-a", "q-b", f"q-{i}"]))
        items.append(
            GraceInput(QARecord(f"s{i}", question, ("ans",), "bundled", tuple(gold), ("ev",), tuple(distractors)))
        )
    names = draw(
        st.lists(
            st.sampled_from(["oracle", "bm25", "dense", "dense+rerank", "random"]), min_size=1, max_size=5, unique=True
        )
    )
    retrievers = [
        ListRetriever(
            name,
            {it.record.id: draw(st.lists(st.sampled_from(IDS), min_size=0, max_size=k, unique=True)) for it in items},
        )
        for name in names
    ]
    return items, retrievers, corpus, k, draw(st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(grace_problem())
def test_construct_invariants(problem) -> None:
    items, retrievers, corpus, k, seed = problem
    examples, stats = construct(items, retrievers, corpus, k, seed)
    by_id = {it.record.id: it.record for it in items}
    keys = set()
    for example in examples:
        record = by_id[example.record.id]
        assert len(example.passage_ids) == k and len(set(example.passage_ids)) == k
        if example.answerable:
            assert set(record.gold_passage_ids) <= set(example.passage_ids)
        else:
            assert not set(record.gold_passage_ids) & set(example.passage_ids)
        key = (record.question, tuple(corpus[p] for p in example.passage_ids))
        assert key not in keys  # merged and deduplicated on (question, context)
        keys.add(key)
    for retriever in retrievers:  # balance before dedup: kept + dropped = the 50/50 split
        produced = (
            stats.answerable[retriever.name] + stats.unanswerable[retriever.name] + stats.duplicates[retriever.name]
        )
        assert produced == len(items)
        kept = Counter(e.answerable for e in examples if e.retriever == retriever.name)
        assert kept[True] == stats.answerable[retriever.name] and kept[False] == stats.unanswerable[retriever.name]
    assert stats.total == len(examples)
    again, _ = construct(items, retrievers, corpus, k, seed)
    assert again == examples  # seeded: identical output


@settings(max_examples=60, deadline=None)
@given(grace_problem())
def test_natural_construction_keeps_the_retrieval(problem) -> None:
    """The test set (§4.3): contexts are the top-k as retrieved; answerable exactly when the gold is in it."""
    items, retrievers, corpus, k, seed = problem
    examples, stats = construct(items, retrievers, corpus, k, seed, natural=True)
    rankings = {r.name: r.rankings for r in retrievers}
    for example in examples:
        retrieved = rankings[example.retriever][example.record.id][:k]
        assert list(example.passage_ids) == retrieved
        assert example.answerable == (set(example.record.gold_passage_ids) <= set(retrieved))
        assert example.gold_evidence == (example.record.gold_evidence if example.answerable else ())
    for retriever in retrievers:
        counted = sum(c[retriever.name] for c in (stats.answerable, stats.unanswerable, stats.duplicates))
        empty = sum(not retriever.rankings[item.record.id] for item in items)  # nothing retrieved: no context
        assert counted == len(items) - empty and stats.skipped[retriever.name] == empty
    assert construct(items, retrievers, corpus, k, seed + 1, natural=True)[0] == examples  # no seeded choice


# Passages for questions with answers only: the gold passage is whichever holds an answer.
ANSWER_CORPUS = {
    "a1": "Nile\nThe Nile flows north. It ends in the Mediterranean Sea near Alexandria.",
    "a2": "Alexandria\nAlexandria lies on the Mediterranean Sea.",
    "n1": "Mediterranean Sea\nA sea between Europe and Africa.",  # the answer only in the title
    "n2": "Amazon\nThe Amazon ends in the Atlantic Ocean.",
    "n3": "Danube\nThe Danube ends in the Black Sea.",
    "n4": "Rhine\nThe Rhine ends in the North Sea.",
    "n5": "Po\nThe Po ends in the Adriatic.",
}
NILE = QARecord("n", "Into which sea does the Nile flow?", ("Mediterranean Sea", "the Mediterranean"), "nq")


def test_an_answer_is_matched_on_whole_tokens_of_the_text() -> None:
    assert contains_answer(ANSWER_CORPUS["a1"], ["mediterranean sea"])  # normalised
    assert not contains_answer(ANSWER_CORPUS["n1"], ["Mediterranean Sea"])  # the title is not the text
    assert not contains_answer("T\nIt was built in 19901.", ["1990"])  # whole tokens, not substrings
    assert contains_answer("T\nIt was built in 1990.", ["1990"])
    assert answer_sentences(ANSWER_CORPUS["a1"], ["Mediterranean Sea"]) == [
        "It ends in the Mediterranean Sea near Alexandria."
    ]
    assert answer_sentences("T\nThe U.S. Army won.", ["U.S. Army"]) == ["The U.S. Army won."]


def test_questions_with_answers_only_are_labelled_by_the_retrieved_passages() -> None:
    item = GraceInput(NILE)
    # The only passage holding the answer is ranked 5th: beyond k = 3.
    ranking = ListRetriever("dense", {"n": ["n1", "n2", "n3", "n4", "a1", "n5"]})
    natural, stats = construct([item], [ranking], ANSWER_CORPUS, 3, natural=True, by_answer=True)
    assert [(e.passage_ids, e.answerable, e.gold_evidence) for e in natural] == [(("n1", "n2", "n3"), False, ())]

    for seed in range(6):  # both sides of the 50/50 split
        (example,), _ = construct([item], [ranking], ANSWER_CORPUS, 3, seed, by_answer=True)
        if example.answerable:  # the best-ranked passage with an answer replaces the lowest-ranked one
            assert example.passage_ids == ("n1", "n2", "a1")
            assert example.gold_evidence == ("It ends in the Mediterranean Sea near Alexandria.",)
        else:  # the top-k had no answer: kept as retrieved
            assert example.passage_ids == ("n1", "n2", "n3") and example.gold_evidence == ()
    answer_first = ListRetriever("bm25", {"n": ["a2", "n1", "a1", "n2", "n3"]})
    for seed in range(6):
        (example,), _ = construct([item], [answer_first], ANSWER_CORPUS, 3, seed, by_answer=True)
        if not example.answerable:  # every passage with an answer out, the next ones without in, in order
            assert example.passage_ids == ("n1", "n2", "n3")


def test_a_sample_with_no_retrieved_answer_cannot_be_answerable_and_is_counted() -> None:
    items = [GraceInput(QARecord(f"s{i}", f"Which sea, {i}?", ("Caspian Sea",), "nq")) for i in range(6)]
    ranking = ListRetriever("dense", {item.record.id: ["n1", "n2", "n3", "n4", "n5"] for item in items})
    examples, stats = construct(items, [ranking], ANSWER_CORPUS, 3, by_answer=True)
    assert stats.skipped["dense"] == 3 and stats.unanswerable["dense"] == 3  # the sufficient half is skipped
    assert all(not e.answerable for e in examples)
    assert stats.as_dict(["dense"])["total"] == {"answerable": 0, "unanswerable": 3, "duplicates": 0, "skipped": 3}
    with pytest.raises(DataPrepError, match="'oracle' needs annotated gold passages"):
        construct(items, [OracleRetriever()], ANSWER_CORPUS, 3, by_answer=True)


def test_construct_with_real_retrievers() -> None:
    records = [
        QARecord(
            q["id"],
            q["question"],
            tuple(q["golden_answers"]),
            "bundled",
            tuple(q["gold_passage_ids"]),
            tuple(q["gold_evidence"]),
            tuple(q["distractor_ids"]),
        )
        for q in QUESTIONS
    ]
    items = [GraceInput(r) for r in records]
    retrievers = [OracleRetriever(), BM25Retriever(PASSAGES), RandomRetriever(list(PASSAGES), seed=1)]
    examples, stats = construct(items, retrievers, PASSAGES, 3, seed=0)
    assert (stats.answerable["oracle"], stats.unanswerable["oracle"], stats.duplicates["oracle"]) == (3, 3, 0)
    for name in ("bm25", "random"):
        assert stats.answerable[name] + stats.unanswerable[name] + stats.duplicates[name] == 6
    oracle = {e.record.id: e for e in examples if e.retriever == "oracle"}
    if oracle["q1"].answerable:
        assert oracle["q1"].passage_ids == ("p01", "p02", "p12")  # gold first, then its distractors
    else:
        assert "p01" not in oracle["q1"].passage_ids and oracle["q1"].passage_ids[:2] == ("p02", "p12")
    two_hop = oracle["q2"]
    assert ({"p03", "p04"} <= set(two_hop.passage_ids)) == two_hop.answerable


def test_bm25_ranks_the_lexical_match_first() -> None:
    bm25 = BM25Retriever(PASSAGES)
    (ranked,) = bm25.retrieve([Query("x", "Into which sea does the Danube empty?")], 2)
    assert ranked[0] == "p09"
    (restricted,) = bm25.retrieve([Query("x", "Danube sea", candidates=("p01", "p10"))], 2)
    assert restricted == ["p10", "p01"]  # Vienna mentions the Danube; ranked only among the candidates


def test_oracle_and_random_retrievers() -> None:
    query = Query("q", "?", gold_ids=("g1", "g2"), distractor_ids=("d1", "g1", "d2"))
    assert OracleRetriever().retrieve([query], 3) == [["g1", "g2", "d1"]]
    random_retriever = RandomRetriever(IDS, seed=5)
    first = random_retriever.retrieve([query], 4)
    assert first == random_retriever.retrieve([query], 4) and len(set(first[0])) == 4


def test_construct_refuses_samples_without_gold() -> None:
    item = GraceInput(QARecord("s", "q?", ("a",), "bundled"))
    with pytest.raises(DataPrepError, match="no gold passages.*--style qa"):
        construct([item], [OracleRetriever()], {"p": "x"}, 1)


# ----------------------------------------------------------------- input styles

HOTPOT = [
    {
        "_id": "h1",
        "question": "Which river runs through the capital of France?",
        "answer": "Seine",
        "supporting_facts": [["Paris", 0], ["Paris", 1]],
        "context": [
            ["Paris", ["Paris is the capital of France.", " The Seine runs through it."]],
            ["Vienna", ["Vienna lies on the Danube."]],
            ["Nile", ["The Nile is long."]],
        ],
    },
    {
        "_id": "h2",
        "question": "Where does the Danube flow?",
        "answer": "Black Sea",
        "supporting_facts": {"title": ["Danube", "Vienna"], "sent_id": [0, 0]},
        "context": {
            "title": ["Danube", "Vienna", "Paris"],
            "sentences": [
                ["The Danube empties into the Black Sea."],
                ["Vienna lies on the Danube."],
                ["Paris is the capital of France.", " The Seine runs through it."],
            ],
        },
    },
]


def test_hotpotqa_reader(tmp_path: Path) -> None:
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(HOTPOT))
    items, corpus = read_hotpotqa(path)
    assert set(corpus) == {"Paris", "Vienna", "Nile", "Danube"}  # shared paragraphs stored once
    assert corpus["Paris"] == "Paris\nParis is the capital of France. The Seine runs through it."
    first, second = (it.record for it in items)
    assert first.gold_passage_ids == ("Paris",)
    assert first.gold_evidence == ("Paris is the capital of France.", "The Seine runs through it.")
    assert set(first.distractor_ids) == {"Vienna", "Nile"}
    assert second.gold_passage_ids == ("Danube", "Vienna") and second.answers == ("Black Sea",)
    # The default pool is the question's own paragraphs (the authors' released code); --file-pool: the whole file.
    assert set(items[0].candidates) == {"Paris", "Vienna", "Nile"}
    assert set(items[1].candidates) == {"Danube", "Vienna", "Paris"}
    assert all(it.evidence_sentences for it in items)  # supporting sentences: one joined reference
    items, _ = read_hotpotqa(path, per_question_pool=False)
    assert all(it.candidates is None for it in items)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps([{**HOTPOT[0], "supporting_facts": [["Rome", 0]]}]))
    with pytest.raises(DataPrepError, match=r"supporting fact title\(s\) \['Rome'\] not in the context"):
        read_hotpotqa(broken)


QASPER = {
    "paper1": {
        "title": "A Study",
        "abstract": "We study things.",
        "full_text": [
            {"section_name": "Intro", "paragraphs": ["We use the SQuAD dataset.", "Results are good."]},
            {"section_name": "Method", "paragraphs": ["Our model is a transformer.", ""]},
        ],
        "qas": [
            {
                "question": "Which dataset is used?",
                "question_id": "qa1",
                "answers": [
                    {
                        "answer": {
                            "unanswerable": False,
                            "extractive_spans": ["SQuAD"],
                            "yes_no": None,
                            "free_form_answer": "",
                            "evidence": ["We use the SQuAD dataset."],
                            "highlighted_evidence": ["We use the SQuAD dataset."],
                        }
                    }
                ],
            },
            {
                "question": "What is the budget?",
                "question_id": "qa2",
                "answers": [
                    {
                        "answer": {
                            "unanswerable": True,
                            "extractive_spans": [],
                            "yes_no": None,
                            "free_form_answer": "",
                            "evidence": [],
                            "highlighted_evidence": [],
                        }
                    }
                ],
            },
            {
                "question": "Is it a transformer?",
                "question_id": "qa3",
                "answers": [
                    {
                        "answer": {
                            "unanswerable": False,
                            "extractive_spans": [],
                            "yes_no": True,
                            "free_form_answer": "",
                            "evidence": ["Our model is a transformer."],
                            "highlighted_evidence": [],
                        }
                    }
                ],
            },
        ],
    }
}


def test_qasper_reader_and_per_paper_pool(tmp_path: Path) -> None:
    path = tmp_path / "qasper.json"
    path.write_text(json.dumps(QASPER))
    items, corpus, skipped = read_qasper(path)
    assert skipped == 1  # the unanswerable question
    assert len(corpus) == 3  # empty paragraph dropped
    dataset_q, transformer_q = items
    assert dataset_q.record.answers == ("SQuAD",) and transformer_q.record.answers == ("yes",)
    assert corpus[dataset_q.record.gold_passage_ids[0]] == "A Study: Intro\nWe use the SQuAD dataset."
    assert transformer_q.record.gold_evidence == ("Our model is a transformer.",)  # falls back to evidence
    assert set(dataset_q.candidates) == set(corpus)
    examples, stats = construct(items, [BM25Retriever(corpus), RandomRetriever(list(corpus))], corpus, 2, seed=0)
    for example in examples:  # every context stays inside the paper
        assert set(example.passage_ids) <= set(corpus)
    assert stats.total == len(examples)


def test_dense_questions_get_the_models_own_query_prompt() -> None:
    """Qwen3-Embedding (GRACE's retriever) defines a ``query`` prompt: questions are encoded with it."""
    import numpy as np

    from verl_evidence.dataprep.retrievers import DenseRetriever, _default_dense_model

    dense = DenseRetriever(PASSAGES, _default_dense_model())
    question = "Into which sea does the Danube empty?"
    plain = dense.scores([question])
    dense.model.prompts = {**(dense.model.prompts or {}), "query": "Instruct: find the passage.\nQuery: "}
    prompted = dense.scores([question])
    expected = dense.model.encode(["Instruct: find the passage.\nQuery: " + question], normalize_embeddings=True)
    assert not np.allclose(plain, prompted)
    assert np.allclose(prompted, expected @ dense.embeddings.T, atol=1e-5)
    dense.query_prefix = "query: "  # an explicit prefix (E5) wins over the model's prompt
    assert dense._prompt("query", dense.query_prefix) is None
