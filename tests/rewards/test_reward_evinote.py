"""EviNote-RAG reward: SEN annotation check, format, gate values and EQR handling."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_evidence.rewards import evinote
from verl_evidence.rewards.evinote import (
    EviNoteConfig,
    build_claim,
    compute_score,
    format_ok,
    last_summary,
    notes_ok,
    policy_text,
    score,
)


def rollout(summaries: list[str], answer: str | None = "Paris", information: str = "Doc 1: Paris.") -> str:
    parts = ["<think>I should search.</think><search>capital of France</search>"]
    for note in summaries:
        parts.append(f"<information>{information}</information><summary>{note}</summary>")
    if answer is not None:
        parts.append(f"<think>done</think><answer>{answer}</answer>")
    return "".join(parts)


GOOD_NOTE = "*Paris* is the capital of France; -perhaps- since 987."


@pytest.mark.parametrize(
    ("note", "expected"),
    [
        ("*Paris* is the capital.", True),
        ("-maybe- Lyon.", True),
        ("*Paris* and -maybe Lyon-.", True),
        ("**Paris** is the capital.", True),  # a run counts once: markdown bold pairs
        ("No annotation at all.", False),
        ("*Paris is the capital.", False),  # unclosed
        ("*Paris* and -maybe Lyon.", False),  # the - is unclosed
        ("A well-known state-of-the-art fact from 2-3 sources.", False),  # hyphens inside words: no markers
        ("*Paris* is well-known.", True),  # ... and they do not unbalance real markers
        ("*Paris* scored 5*3 points.", True),  # word-internal * is not a marker
        ("Paris - the capital - *France*.", True),  # free-standing dashes are punctuation
        ("- a bullet\n- another bullet", False),  # list bullets are not annotations
        ("- a bullet with *key* info", True),
        ("** **", False),  # pairs around blank text are not annotations
        ("*  *", False),
        ("", False),
        ("(-uncertain-)", True),
        ("temperature of -5 degrees", False),  # a minus sign opens a marker that never closes
    ],
)
def test_notes_ok_default_markers(note: str, expected: bool) -> None:
    assert notes_ok(note, ("*", "-")) is expected


def test_notes_ok_custom_markers() -> None:
    # the released code's markers: * and #
    assert notes_ok("#maybe# and *sure*", ("*", "#")) is True
    assert notes_ok("#maybe and *sure*", ("*", "#")) is False
    # with only * configured, an unpaired - is plain text
    assert notes_ok("*sure* and -dangling", ("*",)) is True
    assert notes_ok("[[key]]", ("[[", "]]")) is False  # each marker pairs with itself


def test_policy_text_drops_information() -> None:
    text = "<search>q</search><information>*unpaired <answer>fake</answer></information><answer>a</answer>"
    assert "fake" not in policy_text(text)
    assert "<answer>a</answer>" in policy_text(text)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (rollout([GOOD_NOTE]), True),
        (rollout([GOOD_NOTE, "plain note"]), True),
        (rollout([]), False),  # no summary
        (rollout([GOOD_NOTE], answer=None), False),  # no answer
        ("<summary>n</summary><answer>a", False),  # unclosed answer
        ("<summary>n<answer>a</answer></summary>", False),  # nested
        ("<think>x<summary>n</summary></think><answer>a</answer>", False),  # nested in think
        ("<summary>n</summary><answer>a</answer>", True),  # minimal
        ("<summary>n</summary></search><answer>a</answer>", False),  # stray close
        # tags inside retrieved documents are the system's, not the policy's
        ("<information>Doc <answer>x</information><summary>n</summary><answer>a</answer>", True),
    ],
)
def test_format_ok(response: str, expected: bool) -> None:
    assert format_ok(response) is expected


def test_last_summary_and_claim() -> None:
    response = rollout(["first *note*", "second *note*"])
    assert last_summary(response) == "second *note*"
    assert last_summary(rollout([])) == ""
    assert last_summary("<information><summary>docs</summary></information>") == ""
    assert build_claim(["Paris", "City of Light"], "What is the capital of France?") == (
        "Paris is the answer to the question: What is the capital of France?"
    )
    assert build_claim("Paris", None, "Q: {question} A: {answer}") == "Q:  A: Paris"
    assert build_claim([], "q") == " is the answer to the question: q"


def test_gate_values_by_hand() -> None:
    golds = ["Paris"]
    # format ok + correct: 1 + EQR
    assert score(rollout([GOOD_NOTE]), golds, 0.7)["score"] == pytest.approx(1.7, abs=1e-12)
    # correct answer does not need good notes
    assert score(rollout(["plain note"]), golds, 0.25)["score"] == pytest.approx(1.25, abs=1e-12)
    # wrong answer, notes ok: 0.1 + EQR
    assert score(rollout([GOOD_NOTE], answer="Lyon"), golds, 0.4)["score"] == pytest.approx(0.5, abs=1e-12)
    # wrong answer, notes not ok: 0 (EQR not added)
    result = score(rollout(["plain note"], answer="Lyon"), golds, 0.9)
    assert result["score"] == 0.0 and result["gate"] == 0.0
    # format broken: 0 even with the correct answer and good notes
    assert score(rollout([GOOD_NOTE], answer=None) + "<answer>Paris", golds, 0.9)["score"] == 0.0
    # no summary -> format fails -> 0 and EQR forced to 0
    result = score(rollout([]), golds, 0.9)
    assert result["score"] == 0.0 and result["eqr"] == 0.0 and result["has_summary"] == 0.0


@pytest.mark.parametrize(
    ("notes", "expected"),
    [
        # the spec: at least one annotation in the notes, every marker closed
        (["plain first note", GOOD_NOTE], True),  # a plain note beside an annotated one
        ([GOOD_NOTE, "plain last note"], True),
        (["", GOOD_NOTE], True),  # an empty note beside an annotated one
        (["-maybe- first", GOOD_NOTE], True),
        (["plain", "also plain"], False),  # no annotation anywhere
        (["", ""], False),
        (["*unclosed note", GOOD_NOTE], False),  # an unclosed marker in any note fails
        ([GOOD_NOTE, "plain but -dangling"], False),
        (["*key starts here", "and ends here*"], False),  # a pair never spans two notes
        (["well-known plain note", "*Paris*"], True),  # word-internal hyphens are not markers
        (["Paris - France - Europe", "*Paris*"], True),  # free-standing dashes are not markers
        (["* *", "plain"], False),  # a pair around blank text is not an annotation
    ],
)
def test_note_taking_criterion_over_all_summaries(notes: list[str], expected: bool) -> None:
    assert evinote.note_taking_ok(notes) is expected
    result = score(rollout(notes, answer="Lyon"), ["Paris"], 0.5)
    assert result["num_summaries"] == float(len(notes))
    assert result["notes_ok"] == float(expected)
    # wrong answer: 0.1 + EQR when note-taking holds, else 0
    assert result["score"] == pytest.approx(0.6 if expected else 0.0, abs=1e-12)


def test_upper_case_tags_are_not_summaries() -> None:
    response = rollout(["plain note"], answer="Lyon").replace(
        "<think>done</think>", "<SUMMARY>*Paris*</SUMMARY><think>done</think>"
    )
    result = score(response, ["Paris"], 0.5)
    assert result["num_summaries"] == 1.0 and result["notes_ok"] == 0.0 and result["score"] == 0.0
    assert last_summary(response) == "plain note"


def test_eqr_is_clamped_and_sanitized() -> None:
    golds = ["Paris"]
    response = rollout([GOOD_NOTE])
    assert score(response, golds, 1.7)["score"] == 2.0
    assert score(response, golds, -0.3)["score"] == 1.0
    assert score(response, golds, float("nan"))["score"] == 1.0
    assert score(response, golds, "junk")["score"] == 1.0
    assert score(response, golds, None)["score"] == 1.0


def test_config() -> None:
    cfg = EviNoteConfig()
    assert cfg.markers == ("*", "-") and cfg.correct_reward == 1.0 and cfg.note_reward == 0.1
    assert cfg.claim_template == "{answer} is the answer to the question: {question}"
    assert cfg.max_score == 2.0
    assert EviNoteConfig(markers=["*", "#"]).markers == ("*", "#")
    for bad in ({"markers": ("",)}, {"markers": ("a",)}, {"claim_template": "{nope}"}, {"note_reward": -1.0}):
        with pytest.raises(ValueError):
            EviNoteConfig(**bad)


def test_compute_score() -> None:
    response = rollout([GOOD_NOTE], answer="Lyon")
    result = compute_score("nq", response, {"target": ["Paris"]}, {"eqr": 0.3, "question": "q"})
    assert tuple(result) == evinote.RESULT_KEYS
    assert result["score"] == pytest.approx(0.4, abs=1e-12)
    # kwargs override the config: custom note reward, markers from YAML lists
    result = compute_score("nq", response, {"target": ["Paris"]}, {"eqr": 0.3}, note_reward=0.2, markers=["*", "-"])
    assert result["score"] == pytest.approx(0.5, abs=1e-12)
    # absent EQR is 0
    assert compute_score("nq", response, {"target": ["Paris"]}, None)["score"] == pytest.approx(0.1, abs=1e-12)
    for garbage in ("", None, "<summary>", "<answer></answer>" * 5):
        result = compute_score("nq", garbage, 12345, {"eqr": "bad"})
        assert tuple(result) == evinote.RESULT_KEYS
        assert all(isinstance(v, float) and math.isfinite(v) for v in result.values())
        assert result["score"] == 0.0


hyphenated_words = st.lists(
    st.from_regex(r"[A-Za-z0-9]{1,6}(-[A-Za-z0-9]{1,6}){1,3}", fullmatch=True), min_size=1, max_size=5
)


@settings(max_examples=200, deadline=None)
@given(hyphenated_words, st.sampled_from([GOOD_NOTE, "plain words only", "*unclosed key", "-maybe- *sure*"]))
def test_hyphenated_words_never_change_the_note_check(words: list[str], note: str) -> None:
    with_words = note + " " + " ".join(words) + " end"
    assert notes_ok(with_words) is notes_ok(note + " end")
