"""Shared text utilities: SQuAD metrics, tags, ground-truth coercion."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verl_evidence.rewards.qa_metrics import answer_recall, exact_match, f1_score, normalize, whitespace_token_count
from verl_evidence.text.ground_truth import FALSE_WORDS, TRUE_WORDS, coerce_ground_truth, parse_bool
from verl_evidence.text.stops import cut_at_stop
from verl_evidence.text.tags import block_sequence, extract_last, find_blocks, strip_thinking, tag_events


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("a cat, an owl and THE dog.", "cat owl and dog"),
        ("  theater  ", "theater"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("", ""),
        ("¡Hola, señor!", "¡hola señor"),  # only ASCII punctuation is dropped (SQuAD)
        ("tab\tand\nnewline", "tab and newline"),
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


def test_exact_match() -> None:
    assert exact_match("The Paris.", ["paris"]) == 1.0
    assert exact_match("Paris", ["Lyon", "paris "]) == 1.0
    assert exact_match("Paris, France", ["Paris"]) == 0.0
    assert exact_match("Paris", "Paris") == 1.0  # a bare gold string
    assert exact_match("Paris", []) == 0.0
    # an empty prediction is never correct, even against a gold that normalizes to ""
    assert exact_match("", ["the"]) == 0.0
    assert exact_match("the", ["a"]) == 0.0


def test_f1_by_hand() -> None:
    # pred tokens [barack, obama, jr], gold [barack, obama]: P = 2/3, R = 1, F1 = 2*(2/3)/(5/3) = 0.8
    assert f1_score("Barack Obama Jr.", ["Barack Obama"]) == pytest.approx(0.8)
    # max over golds
    assert f1_score("Barack Obama Jr.", ["Michelle", "Barack Obama Jr"]) == pytest.approx(1.0)
    # repeated tokens count by multiplicity: pred [a1 a1 b], gold [a1 b b]: common {a1:1,b:1} = 2; P=R=2/3
    assert f1_score("x x y", ["x y y"]) == pytest.approx(2 / 3)
    assert f1_score("", ["Paris"]) == 0.0
    assert f1_score("Paris", []) == 0.0
    assert f1_score("Lyon", ["Paris"]) == 0.0


def test_answer_recall() -> None:
    assert answer_recall("The capital is Paris, of course.", ["paris"]) == 1.0
    assert answer_recall("The capital is Lyon.", ["Paris", "Marseille"]) == 0.0
    assert answer_recall("Anything at all", ["the"]) == 0.0  # an empty normalized gold never matches
    assert answer_recall("Paris", "Paris") == 1.0


def test_whitespace_token_count() -> None:
    assert whitespace_token_count("a  b\nc") == 3
    assert whitespace_token_count(["a b", "c d e"]) == 5
    assert whitespace_token_count(np.array(["a b", "c"])) == 3
    assert whitespace_token_count(None) == 0


# --------------------------------------------------------------------------- tags


def test_extract_last_takes_last_complete_block() -> None:
    assert extract_last("<answer> a </answer> <answer>b</answer>", "answer") == "b"
    assert extract_last("<answer>a</answer> <answer>b", "answer") == "a"  # trailing unclosed ignored
    assert extract_last("<answer>x <answer>y</answer>", "answer") == "y"  # innermost open before the close
    assert extract_last("no tags here", "answer") is None
    assert extract_last("</answer> only a close", "answer") is None
    assert extract_last("<answer></answer>", "answer") == ""
    assert extract_last("<answer>multi\nline</answer>", "answer") == "multi\nline"
    assert extract_last("<answer>x</answer></answer>", "answer") == "x"  # stray trailing close skipped
    assert extract_last("<answer>x</answer></answer></answer>", "answer") == "x"
    assert extract_last("</answer></answer>", "answer") is None


def test_find_blocks() -> None:
    text = "<s>one</s> junk <s> two </s><s>unclosed"
    assert find_blocks(text, "s") == ["one", "two"]
    assert find_blocks("<s>x<s>y</s>", "s") == ["y"]
    assert find_blocks("</s><s>a</s></s>", "s") == ["a"]
    assert find_blocks("", "s") == []


def test_strip_thinking() -> None:
    assert strip_thinking("<think>a</think>b<think>c</think> final") == " final"
    assert strip_thinking("no thinking") == "no thinking"
    assert strip_thinking("<think>unclosed <answer>x</answer>") == "<think>unclosed <answer>x</answer>"


def test_tag_events_and_block_sequence() -> None:
    text = "<reason>r</reason> <extract>e</extract><answer>a</answer>"
    events = tag_events(text, ("reason", "extract", "answer"))
    assert [(t, c) for t, c, _, _ in events] == [
        ("reason", False),
        ("reason", True),
        ("extract", False),
        ("extract", True),
        ("answer", False),
        ("answer", True),
    ]
    assert text[events[0][2] : events[0][3]] == "<reason>"
    tags = ("reason", "extract", "answer")
    assert block_sequence(text, tags) == ["reason", "extract", "answer"]
    assert block_sequence("<reason><extract>e</extract></reason>", tags) is None  # nested
    assert block_sequence("<reason>r</extract>", tags) is None  # wrong close
    assert block_sequence("<reason>r", tags) is None  # unclosed
    assert block_sequence("r</reason>", tags) is None  # stray close
    assert block_sequence("<other>x</other>", tags) == []  # unlisted tags are plain text
    assert block_sequence("<answer>a</answer><answer>b</answer>", tags) == ["answer", "answer"]


# --------------------------------------------------------------------------- ground truth


def test_coerce_ground_truth_shapes() -> None:
    full = {"target": ["Paris", "City of Light"], "evidence": ["Paris is the capital."], "answerable": True}
    assert coerce_ground_truth(full) == full
    # Search-R1: numpy array of answers from parquet
    assert coerce_ground_truth({"target": np.array(["a", "b"], dtype=object)}) == {
        "target": ["a", "b"],
        "evidence": [],
        "answerable": None,
    }
    assert coerce_ground_truth("Paris") == {"target": ["Paris"], "evidence": [], "answerable": None}
    assert coerce_ground_truth(["a", "b"])["target"] == ["a", "b"]
    assert coerce_ground_truth(np.array(["x"]))["target"] == ["x"]
    assert coerce_ground_truth({"target": "solo"})["target"] == ["solo"]
    assert coerce_ground_truth({"target": [1990, None, ""]})["target"] == ["1990"]
    assert coerce_ground_truth({"answerable": np.bool_(False)})["answerable"] is False
    assert coerce_ground_truth({"answerable": "true"})["answerable"] is True
    assert coerce_ground_truth({"answerable": 0})["answerable"] is False
    assert coerce_ground_truth({"answerable": "maybe"})["answerable"] is None
    assert coerce_ground_truth(json.dumps(full)) == full
    for weird in (None, 3.5, object(), {"target": {"nested": "dict"}}, b"bytes", "{not json"):
        out = coerce_ground_truth(weird)
        assert set(out) == {"target", "evidence", "answerable"}
        assert all(isinstance(t, str) for t in out["target"])


class _CharTokenizer:
    """One token per character (id = code point): enough for ``cut_at_stop``, which only decodes."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def test_cut_at_stop_keeps_the_token_that_completes_a_stop_string() -> None:
    ids = [ord(c) for c in "go <search> q </search> and more"]
    kept, why = cut_at_stop(ids, _CharTokenizer(), ["</search>", "</answer>"], set())
    assert "".join(map(chr, kept)) == "go <search> q </search>" and why == "stop"


def test_cut_at_stop_on_a_stop_token_and_without_any_stop() -> None:
    ids = [ord(c) for c in "abcdef"]
    kept, why = cut_at_stop(ids, _CharTokenizer(), [], {ord("c")})
    assert kept == ids[:3] and why == "stop"
    kept, why = cut_at_stop(ids, _CharTokenizer(), ["zz"], {0})
    assert kept == ids and why == "length"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        (2.5, True),
        (0.0, False),
        (float("nan"), None),
        (float("-inf"), None),
        ("true", True),
        (" Yes ", True),
        ("1", True),
        ("FALSE", False),
        ("no", False),
        ("0", False),
        ("maybe", None),
        ("validation", None),
        ("answerable", None),
        ("", None),
        (None, None),
        ([True], True),
        (np.array(["no"]), False),
        (np.bool_(True), True),
        ([1, 0], None),
    ],
)
def test_parse_bool_reads_one_word_list(value, expected) -> None:
    assert parse_bool(value) is expected


def test_ground_truth_and_grace_validation_flag_use_the_same_words() -> None:
    from verl_evidence.rewards.grace import GRACE_VALIDATION, config_from_kwargs

    for word in TRUE_WORDS:
        assert coerce_ground_truth({"answerable": word.upper()})["answerable"] is True
        assert config_from_kwargs({}, {"validate": word}) == GRACE_VALIDATION
    for word in FALSE_WORDS:
        assert coerce_ground_truth({"answerable": word})["answerable"] is False
        assert config_from_kwargs({}, {"validate": word}) != GRACE_VALIDATION
