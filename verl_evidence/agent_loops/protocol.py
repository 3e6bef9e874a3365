"""The planner/executor text protocol: how a turn's action is read, how a planner searches, how an observation reads
and how the executor sees a sub-question. One definition shared by the ``evidence_search`` loop and EviPath's SFT
writer, so the loop runs a fine-tuned planner exactly in the layout it was trained on (``evipath/writer.py``):

- ``paper``: ``<action> Search("q1") Search("q2") </action>``; observations as one
  ``Observation:`` message, one sentence per search.
- ``search``: ``<search> q </search>`` (one per turn); observation ``<information> … </information>``.

No heavy imports: the agent loop imports this in every rollout worker.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from verl_evidence.prompts import load_prompt, render_prompt
from verl_evidence.text.tags import find_blocks

PLANNER_LAYOUTS = ("paper", "search")
PAPER_QUESTION_PROMPT = "evipath_planner_question"  # the paper layout's user turn: "Question: {question}"

# Search("..."), Search('...'), and the entity-tagged variant Search([0], "...").
SEARCH_CALL = re.compile(
    r"""Search\(\s*(?:\[[^\]]*\]\s*,\s*)?(?P<q>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*\)""",
)
SEARCH_WORD = re.compile(r"\bSearch\s*\(")


def unquote(literal: str) -> str:
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        value = literal[1:-1]
    return " ".join(str(value).split())


def search_calls(text: str) -> list[str]:
    """The queries of every ``Search("…")`` call in ``text``, in order (whitespace collapsed)."""
    return [unquote(m.group("q")) for m in SEARCH_CALL.finditer(text)]


def user_prompt(template_name: str, question: str) -> str:
    """A planner user turn rendered from a prompt template (stripped, as the writer stores it)."""
    return render_prompt(load_prompt(template_name).strip(), question=question)


def observation_text(sentences: Sequence[str]) -> str:
    """The paper layout's observation message: one line per search of the step."""
    return "Observation:\n" + "\n".join(sentences)


def information_text(observation: str) -> str:
    """The search layout's observation message."""
    return f"<information> {observation} </information>"


def executor_user(question: str, pool: Sequence[str]) -> str:
    """The executor's input, as the fine-tuned executor sees it: the sub-question and the numbered pool."""
    numbered = "\n".join(f"[{i}] {fact}" for i, fact in enumerate(pool))
    return f"Question: {question}\nSupporting evidence:\n{numbered}"


def pool_item(contents: str) -> str:
    """A retrieved passage (``"Title\\ntext"``) as a pool item (``"Title: text"``, the training facts' form)."""
    title, _, text = contents.partition("\n")
    return f"{title}: {text}" if text else title


# Reading a turn's action


def first_action(text: str) -> tuple[str, str, int] | None:
    """``(kind, content, end offset)`` of the first complete ``<search>`` or ``<answer>`` block."""
    return first_block(text, ("search", "answer"))


def first_block(text: str, kinds: tuple[str, ...]) -> tuple[str, str, int] | None:
    """``(kind, content, end offset)`` of the first complete block of one of ``kinds``."""
    best = None
    for kind in kinds:
        close = text.find(f"</{kind}>")
        if close < 0:
            continue
        opening = text.rfind(f"<{kind}>", 0, close)
        if opening < 0:
            continue
        end = close + len(kind) + 3
        if best is None or end < best[2]:
            best = (kind, text[opening + len(kind) + 2 : close].strip(), end)
    return best


def planner_action(text: str, action_format: str = "search") -> tuple[str, list[str], int] | None:
    """The turn's first complete action: ``("search", queries, end)`` or ``("answer", [answer], end)``.

    ``search`` layout: one ``<search> q </search>``; ``paper`` layout: the ``Search("…")`` calls of
    an ``<action>`` block (EviPath). A search without a (non-empty) query has ``queries == []``.
    """
    if action_format == "paper":
        block = first_block(text, ("action", "answer"))
        if block is None or block[0] == "answer":
            return None if block is None else ("answer", [block[1]], block[2])
        return "search", [q for q in search_calls(block[1]) if q], block[2]
    block = first_action(text)
    if block is None:
        return None
    if block[0] == "answer":
        return "answer", [block[1]], block[2]
    return "search", [block[1]] if block[1] else [], block[2]


def last_thought(turn_text: str) -> str:
    thoughts = find_blocks(turn_text, "think")
    if thoughts:
        return thoughts[-1]
    return turn_text.split("<search>")[0].strip()
