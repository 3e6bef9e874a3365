"""text.rouge_l must equal rouge-score's RougeScorer(['rougeL'], use_stemmer=True) fmeasure (max over refs)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rouge_score import rouge_scorer
from rouge_score.rouge_scorer import _lcs_table
from rouge_score.tokenizers import DefaultTokenizer

from verl_evidence.rewards.rouge import _lcs_length, rouge_l, rouge_tokens

SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
REFERENCE_TOKENIZER = DefaultTokenizer(use_stemmer=True)


def reference_rouge_l(prediction: str, references: list[str]) -> float:
    if not references:
        return 0.0
    return max(SCORER.score(ref, prediction)["rougeL"].fmeasure for ref in references)


SENTENCES = [
    "Paris is the capital and most populous city of France.",
    "The Eiffel Tower was built for the 1889 World's Fair.",
    "Marie Curie won Nobel Prizes in both physics and chemistry.",
    "Running, runners and runs: the stemmer reduces them generously.",
    "He was born on 4 August 1961 in Honolulu, Hawaii.",
    "The company's revenues grew by 12.5% in fiscal year 2019-2020.",
    "São Paulo is Brazil's largest city; Zürich is in Switzerland.",
    "Unanswerable: the passages do not mention the author's birthplace.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "The quick brown fox jumps over the lazy dog repeatedly.",
    "Apollo 11 landed on the Moon on July 20, 1969.",
    "Tokyo (東京) is the capital of Japan — population ≈ 14 million.",
    "İstanbul straddles Europe and Asia across the Bosphorus.",
    "The KELVIN sign K and the ﬁ ligature are odd unicode cases.",
    "connection connections connected connecting connective",
    "generalizations generalization generalize generally general",
]

WORDS = sorted({w for s in SENTENCES for w in s.split()}) + [
    "",
    "a",
    "an",
    "the",
    "...",
    "--",
    "3.14",
    "1,000,000",
    "x2",
    "caresses",
    "ponies",
    "ties",
    "agreed",
    "happily",
    "relational",
    "dying",
    "sky",
    "naïve",
    "café",
    "Straße",
    "ǅ",
    "ß",
    "\u0130",
    "\u212a",
    "\t",
    "\n",
    "🙂",
]


def random_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.1:
        return ""
    if kind < 0.2:  # raw random characters, including punctuation and unicode
        alphabet = "abcXYZ019 .,;:!?-'\"()[]<>/\\\n\téüßİK東🙂"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    if kind < 0.6:  # word soup
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 30)))
    # real-looking: sentences, some mutated
    out = []
    for _ in range(rng.randint(1, 3)):
        words = rng.choice(SENTENCES).split()
        if rng.random() < 0.5 and words:
            words = [w for w in words if rng.random() > 0.3]
            rng.shuffle(words) if rng.random() < 0.3 else None
        out.append(" ".join(words))
    return " ".join(out)


def test_tokenizer_identical() -> None:
    rng = random.Random(7)
    texts = SENTENCES + WORDS + [random_text(rng) for _ in range(2000)]
    for text in texts:
        assert list(rouge_tokens(text)) == REFERENCE_TOKENIZER.tokenize(text), text


def test_lcs_matches_dp_table() -> None:
    rng = random.Random(11)
    for _ in range(5000):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 40))]
        b = [rng.choice("abcde") for _ in range(rng.randint(0, 40))]
        expected = _lcs_table(a, b)[-1][-1] if a and b else 0
        assert _lcs_length(a, b) == expected
    # longer than a machine word: exercises the big-int carries
    a = [rng.choice("ab") for _ in range(300)]
    b = [rng.choice("ab") for _ in range(200)]
    assert _lcs_length(a, b) == _lcs_table(a, b)[-1][-1]


def test_rouge_l_identical_on_thousands_of_pairs() -> None:
    rng = random.Random(1234)
    checked = 0
    nonzero = 0
    for _ in range(4000):
        prediction = random_text(rng)
        references = [random_text(rng) for _ in range(rng.randint(1, 3))]
        ours = rouge_l(prediction, references)
        theirs = reference_rouge_l(prediction, references)
        assert ours == pytest.approx(theirs, abs=1e-9), (prediction, references)
        checked += 1
        nonzero += theirs > 0
    assert checked == 4000
    assert nonzero > 1000  # the sample exercises real overlaps, not just zeros


def test_rouge_l_known_values() -> None:
    # identical text -> 1; disjoint -> 0; stemming: "running" == "runs" after Porter ("run")
    assert rouge_l("Paris is the capital", ["Paris is the capital"]) == 1.0
    assert rouge_l("apples", ["oranges"]) == 0.0
    assert rouge_l("running", ["runs"]) == 1.0
    # by hand: pred [the, cat, sat], ref [the, cat, on, mat]: LCS 2, P = 2/3, R = 1/2, F = 4/7
    assert rouge_l("the cat sat", ["the cat on mat"]) == pytest.approx(4 / 7, abs=1e-12)
    assert rouge_l("", ["x"]) == 0.0
    assert rouge_l("x", []) == 0.0
    assert rouge_l("x", "x") == 1.0  # a bare reference string


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60), st.lists(st.text(max_size=60), min_size=1, max_size=3))
def test_rouge_l_identical_property(prediction: str, references: list[str]) -> None:
    assert rouge_l(prediction, references) == pytest.approx(reference_rouge_l(prediction, references), abs=1e-9)


def test_rouge_l_identical_on_long_texts() -> None:
    # evidence blocks of hundreds of tokens: the bit vectors span many machine words
    rng = random.Random(99)
    for _ in range(40):
        prediction = " ".join(rng.choice(SENTENCES) for _ in range(rng.randint(10, 40)))
        references = [" ".join(rng.choice(SENTENCES) for _ in range(rng.randint(5, 30))) for _ in range(2)]
        assert rouge_l(prediction, references) == pytest.approx(reference_rouge_l(prediction, references), abs=1e-9)
