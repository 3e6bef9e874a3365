"""Property tests: any response, any ground truth, any extra_info -> no exception, same keys,
finite floats, score within the method's documented bounds."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_evidence.rewards import evinote, eviomni, grace
from verl_evidence.rewards.rouge import rouge_l
from verl_evidence.text.ground_truth import coerce_ground_truth
from verl_evidence.text.tags import extract_last, find_blocks

TAG_NAMES = ["reason", "extract", "answer", "think", "search", "information", "summary", "evidence", "llm"]
FRAGMENTS = (
    [f"<{t}>" for t in TAG_NAMES]
    + [f"</{t}>" for t in TAG_NAMES]
    + [
        "Paris",
        "the capital",
        "*",
        "-",
        "**",
        " ",
        "\n",
        "well-known",
        "2-3",
        "<",
        ">",
        "</",
    ]
)

# Responses built from protocol tags and words hit the interesting branches; plain text adds noise.
responses = st.one_of(
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=30).map("".join),
    st.text(max_size=200),
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=10),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)
ground_truths = st.one_of(
    values,
    st.fixed_dictionaries(
        {},
        optional={
            "target": st.one_of(values, st.lists(st.sampled_from(["Paris", "the capital", ""]), max_size=3)),
            "evidence": st.one_of(values, st.lists(st.text(max_size=40), max_size=3)),
            "answerable": values,
        },
    ),
    st.lists(st.text(max_size=10), max_size=3).map(lambda xs: {"target": np.array(xs, dtype=object)}),
)
extra_infos = st.one_of(
    st.none(),
    values,
    st.fixed_dictionaries(
        {},
        optional={
            "eviomni_answer_r": values,
            "eviomni_answer_e": values,
            "eviomni_len_r": values,
            "eviomni_len_e": values,
            "eviomni_len_p": values,
            "passages": values,
            "eqr": values,
            "question": values,
            "validate": values,
        },
    ),
)

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(result: dict, keys: tuple[str, ...], upper: float) -> None:
    assert tuple(result) == keys
    assert all(isinstance(v, float) and math.isfinite(v) for v in result.values()), result
    assert 0.0 <= result["score"] <= upper + 1e-12, result


@SETTINGS
@given(responses, ground_truths, extra_infos)
def test_eviomni_any_input(response, gt, extra) -> None:
    check(eviomni.compute_score("ds", response, gt, extra), eviomni.RESULT_KEYS, 1.0)


@SETTINGS
@given(responses, ground_truths, extra_infos)
def test_evinote_any_input(response, gt, extra) -> None:
    check(evinote.compute_score("ds", response, gt, extra), evinote.RESULT_KEYS, 2.0)


@SETTINGS
@given(responses, ground_truths, extra_infos)
def test_grace_any_input(response, gt, extra) -> None:
    result = grace.compute_score("ds", response, gt, extra)
    check(result, grace.RESULT_KEYS, 0.5 + 1.0 + 2.0 + 3.0)
    # the gate only ever yields 0, 0.5, 1.5 or 1.5 + content
    assert result["score"] in (0.0, 0.5, 1.5) or result["score"] >= 1.5


@SETTINGS
@given(
    responses,
    st.floats(0.01, 5),
    st.floats(0, 3),
    st.floats(0, 1),
    st.floats(0, 2),
    st.floats(0, 2),
    st.floats(0, 2),
)
def test_eviomni_bounds_with_any_config(response, tau, gamma, omega, l1, l2, l3) -> None:
    extra = {"eviomni_answer_r": response, "eviomni_answer_e": response}
    result = eviomni.compute_score(
        "ds", response, "Paris", extra, tau=tau, gamma=gamma, omega=omega, l1=l1, l2=l2, l3=l3
    )
    check(result, eviomni.RESULT_KEYS, l1 + l2 + l3)


@SETTINGS
@given(responses, ground_truths, st.floats(0, 10), st.floats(0, 10), st.floats(0, 10), st.floats(0, 10))
def test_grace_bounds_with_any_config(response, gt, fmt, path, alpha, beta) -> None:
    result = grace.compute_score("ds", response, gt, None, format_reward=fmt, path_reward=path, alpha=alpha, beta=beta)
    check(result, grace.RESULT_KEYS, fmt + path + alpha + beta)


@SETTINGS
@given(ground_truths)
def test_coerce_ground_truth_any_input(gt) -> None:
    out = coerce_ground_truth(gt)
    assert set(out) == {"target", "evidence", "answerable"}
    assert all(isinstance(x, str) for x in out["target"] + out["evidence"])
    assert out["answerable"] in (None, True, False)


@SETTINGS
@given(responses, st.sampled_from(TAG_NAMES))
def test_tag_extraction_consistent(response, tag) -> None:
    blocks = find_blocks(response, tag)
    last = extract_last(response, tag)
    # the last complete block is the last block find_blocks sees, and neither contains its own tags
    assert (last is None) == (not blocks)
    if blocks:
        assert last == blocks[-1]
    for block in blocks:
        assert f"</{tag}>" not in block and f"<{tag}>" not in block


@SETTINGS
@given(responses, st.lists(responses, max_size=3))
def test_rouge_l_in_unit_interval(prediction, references) -> None:
    value = rouge_l(prediction, references)
    assert 0.0 <= value <= 1.0


NOTE_PIECES = ["*", "-", "**", " ", "\n", "Paris", "key", "well-known", "2-3", " - ", "maybe"]
notes = st.lists(st.sampled_from(NOTE_PIECES), max_size=12).map("".join)
plain_notes = st.from_regex(r"[A-Za-z0-9 ,.]{0,30}", fullmatch=True)


def evinote_rollout(summaries: list[str]) -> str:
    body = "".join(f"<search>q</search><information>d</information><summary>{s}</summary>" for s in summaries)
    return body + "<answer>a wrong answer</answer>"


@SETTINGS
@given(st.lists(notes, min_size=1, max_size=4), plain_notes, st.integers(0, 4))
def test_evinote_plain_notes_never_change_note_taking(summaries, plain, position) -> None:
    """The criterion is over all notes together: a marker-free (or empty) note added anywhere changes nothing,
    and neither does the order of the notes."""
    before = evinote.score(evinote_rollout(summaries), ["Paris"], 0.5)
    with_plain = summaries[:position] + [plain] + summaries[position:]
    after = evinote.score(evinote_rollout(with_plain), ["Paris"], 0.5)
    assert after["notes_ok"] == before["notes_ok"]
    assert after["gate"] == before["gate"]
    assert evinote.note_taking_ok(summaries[::-1]) is evinote.note_taking_ok(summaries)
    # one note alone is judged as before: notes_ok of that note
    assert evinote.note_taking_ok(summaries[:1]) is (bool(summaries[0].strip()) and evinote.notes_ok(summaries[0]))
