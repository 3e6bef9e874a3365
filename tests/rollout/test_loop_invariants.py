"""The loops' invariants (tests/rollout/invariants.py) on property-based model outputs, for every registered loop of
ours and both vocabularies (the test tokenizer and Qwen2.5's), through verl's AgentLoopWorker and the scripted engine.

Model outputs: tags glued to words, whitespace runs, CJK and emoji, text after a stop string (inside the token that
completes it, in Qwen's vocabulary), missing closing tags, response budgets that cut a turn or an observation; for
the search loop also its settings: observations inline or as user turns, our passage layout or Search-R1's,
``max_obs_tokens`` cuts (none, mid-word, inside a character).
Examples are few and derandomized: the suite's time budget, and a CI run repeats.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from invariants import (
    RecordingBackend,
    check_eviomni_rollout,
    check_lengths,
    check_search_rollout,
    run_and_keep_loop_outputs,
)
from rollout_helpers import continues_a_reply, make_row, unpad, with_settings

from verl_evidence.agent_loops import LOOPS
from verl_evidence.tools.documents import format_documents

QUESTION = "Which river flows north into the Mediterranean?"
PASSAGES = [
    "Nile\nThe Nile flows north through eleven countries and ends in a delta on the Mediterranean coast.",
    "Amazon\nThe Amazon carries more water than any other river and drains into the Atlantic Ocean.",
]
BUDGETS = [8192, 96]  # the whole reply, or one that cuts turns and observations (each budget: one verl worker)

WORDS = ["the", "Nile", "river", "flows", "north", "delta", "长江", "東京", "🙂", "🌊", "naïve", "42", ".", ",", ":"]
WORDS += ["'", '"', "(", ")", "-", "über", "x"]
SPACES = ["", " ", "  ", "\n", "\n\n", "\t", " \n", "\n\n\n"]
# what a model writes right after a closing tag: in Qwen's vocabulary '>' merges with much of it into one token
AFTER = ["", "\n\n", "\n", "The", "<", "><", ".", " ", "\n\nThe answer", "。", "🙂", ">", "</", ")", "\n\n\n"]

words = st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(SPACES)), max_size=6).map(
    lambda parts: "".join(w + s for w, s in parts)
)
content = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)  # a tag's content, never empty
space = st.sampled_from(["", " ", "\n", "  "])
after = st.tuples(st.sampled_from(AFTER), words).map("".join)


def block(tag: str, closed: bool = True):
    """``<tag> content </tag>`` glued to random text on both sides; unclosed: the reply stops inside the block."""
    return st.builds(
        lambda before, pad, inner, pad2, rest: (
            f"{before}<{tag}>{pad}{inner}{pad2}" + (f"</{tag}>{rest}" if closed else "")
        ),
        words,
        space,
        content,
        space,
        after if closed else st.just(""),
    )


def test_every_registered_loop_has_its_invariants_checked():
    assert set(LOOPS) == {"evidence_search", "eviomni"}  # a new loop needs its invariants here


# --- eviomni: no retrieval server (the row brings its passages) ---

first_turn = st.one_of(
    st.builds(lambda r, e: r + e, block("reason"), block("extract")),
    st.builds(lambda r, e: r + e, block("reason"), block("extract", closed=False)),  # never closes </extract>
    words,  # ignores the format
)


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(first=first_turn, answer=block("answer"), budget=st.sampled_from(BUDGETS))
# the case, always run: Qwen's '><' closes </extract>, its '>.' closes </answer>
@example(
    first="<reason> r </reason><extract> e </extract><answer> Nile </answer>",
    answer="<answer> a </answer>.",
    budget=8192,
)
def test_eviomni_invariants(vocab, first, answer, budget):
    tokenizer = vocab.tokenizer
    config = with_settings(
        vocab.config,
        {
            "actor_rollout_ref.rollout.response_length": budget,
            "actor_rollout_ref.rollout.calculate_log_probs": True,
            "actor_rollout_ref.rollout.full_determinism": True,  # request ids name each generation's part
        },
    )

    def respond(prompt: str) -> str:
        if "Some parts may be hidden" in prompt:
            return "<answer> Nile </answer>"
        return answer if continues_a_reply(prompt) else first

    backend = RecordingBackend(tokenizer, responder=respond)
    output, loops = run_and_keep_loop_outputs(config, backend, [make_row(QUESTION, "eviomni", passages=PASSAGES)])
    check_lengths(loops[0])
    passages_block = format_documents([{"document": {"id": str(i), "contents": p}} for i, p in enumerate(PASSAGES)])
    check_eviomni_rollout(
        tokenizer,
        unpad(output),
        backend,
        first,
        answer,
        QUESTION,
        passages_block,
        [p.split("\n", 1)[1] for p in PASSAGES],
        budget,
    )


# --- evidence_search: searches the session's retrieval server ---

QUERIES = ["longest river in Africa", "Nile delta", "Amazon river", "capital of Hungary"]
search_turn = st.builds(
    lambda before, pad, query, pad2, rest: f"{before}<search>{pad}{query}{pad2}</search>{rest}",
    words,
    space,
    st.sampled_from(QUERIES),
    space,
    after,
)
other_turn = st.one_of(search_turn, words)  # a search, or no action (a correction follows)
NO_CUT = 100_000
INSIDE_A_CHARACTER = "inside a character"  # the first cut of the first search's documents that splits a character


@pytest.fixture(scope="module")
def observations(search_url) -> dict[str, dict[str, str]]:
    """Each layout's documents for each query, as the loop shows them (its default top-k)."""
    from retrieval_server.client import RetrievalClient
    from verl_evidence.agent_loops.search_loop_settings import SearchLoopSettings

    results = RetrievalClient(search_url).retrieve(QUERIES, topk=SearchLoopSettings().topk)
    return {
        layout: {query: format_documents(found, layout) for query, found in zip(QUERIES, results)}
        for layout in ("ours", "search_r1")
    }


def max_obs_tokens_for(tokenizer, cut, turns: list[str], observations: dict[str, str]) -> int:
    """``cut`` as a number of tokens: ``INSIDE_A_CHARACTER`` is the first length at which the first searched
    query's documents' ids end inside a character (Budapest's 'Ó' in Qwen's vocabulary), else 20."""
    if cut != INSIDE_A_CHARACTER:
        return cut
    query = next((q for t in turns for q in QUERIES if f"{q}" in t.split("</search>")[0]), None)
    if query is not None:
        ids = tokenizer.encode(observations[query], add_special_tokens=False)
        for n in range(1, len(ids)):
            if not observations[query].startswith(tokenizer.decode(ids[:n])):
                return n
    return 20


def test_an_observation_cut_keeps_whole_characters(vocab):
    """``max_obs_tokens`` at every length of a text whose characters span several tokens (CJK, emoji, accents): the
    kept ids are the text's first ids, at most 3 fewer than asked, and decode to a prefix of the text."""
    from verl_evidence.agent_loops.search_loop import cut_between_characters

    tokenizer = vocab.tokenizer
    text = "Óbuda, 長江 and 東京 🙂🌊 naïve Kraków"
    ids = tokenizer.encode(text, add_special_tokens=False)
    shortened = 0
    for limit in range(1, len(ids) + 1):
        kept = cut_between_characters(tokenizer, ids, text, limit)
        assert kept == ids[: len(kept)] and limit - 3 <= len(kept) <= limit
        assert text.startswith(tokenizer.decode(kept)), limit
        shortened += len(kept) < limit
    assert shortened  # some lengths would have split a character


@pytest.mark.slow
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(other_turn, min_size=1, max_size=3),
    answer=block("answer"),
    budget=st.sampled_from(BUDGETS),
    role=st.sampled_from(["inline", "user"]),
    layout=st.sampled_from(["ours", "search_r1"]),
    cut=st.sampled_from([NO_CUT, INSIDE_A_CHARACTER, 7]),
)
# the case, always run: Qwen's '>\n\n' closes </search>
@example(
    turns=["<search> Nile delta </search>\n\nThe"],
    answer="<answer> Nile </answer>",
    budget=8192,
    role="inline",
    layout="ours",
    cut=NO_CUT,
)
# an observation cut inside a character, inline and as a user turn, in Search-R1's layout and ours
@example(
    turns=["<search> capital of Hungary </search>\n\n", "x <search>capital of Hungary</search>"],
    answer="<answer> Budapest </answer>",
    budget=8192,
    role="inline",
    layout="search_r1",
    cut=INSIDE_A_CHARACTER,
)
@example(
    turns=["<search> capital of Hungary </search>"],
    answer="<answer> Budapest </answer>",
    budget=8192,
    role="user",
    layout="ours",
    cut=INSIDE_A_CHARACTER,
)
def test_search_loop_invariants(vocab, search_url, observations, turns, answer, budget, role, layout, cut):
    tokenizer = vocab.tokenizer
    shown = observations[layout]
    max_obs_tokens = max_obs_tokens_for(tokenizer, cut, turns, shown)
    custom = {
        "retrieval_url": search_url,
        "max_turns": 8,
        "max_obs_tokens": max_obs_tokens,
        "observation_role": role,
        "document_format": layout,
    }
    config = with_settings(
        vocab.config,
        {
            "actor_rollout_ref.rollout.custom": {"evidence_search": custom},
            "actor_rollout_ref.rollout.response_length": budget,
            "actor_rollout_ref.rollout.calculate_log_probs": True,
        },
    )
    backend = RecordingBackend(tokenizer, turns=[*turns, answer])
    output, loops = run_and_keep_loop_outputs(config, backend, [make_row(QUESTION, "evidence_search")])
    check_lengths(loops[0])
    check_search_rollout(tokenizer, unpad(output), backend, shown, budget, role, max_obs_tokens)
