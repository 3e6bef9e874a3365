"""EviPath's planner/executor text protocol, shared by the SFT writer and the search agent loop.

One definition of how a planner turn searches, how an observation reads and how the
executor sees a sub-question, so the ``evidence_search`` loop can run a fine-tuned
planner exactly in the layout it was trained on (``writer.py``):

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
