"""Parsers for the teacher's replies. They never raise on model text.

Each parser returns either a parsed value or a :class:`Malformed` with a short
machine-readable reason (used as the rejection key in the statistics) and a
detail for the log. Parsed turns are re-rendered in one canonical layout, so
the fine-tuning data does not inherit the teacher's formatting slips.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from verl_evidence.evipath.protocol import SEARCH_WORD, search_calls
from verl_evidence.text.tags import extract_last, find_blocks, strip_thinking

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Malformed:
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class PlannerTurn:
    think: str
    searches: tuple[str, ...] = ()
    answer: str | None = None

    @property
    def is_final(self) -> bool:
        return self.answer is not None


@dataclass(frozen=True)
class ExecutorStep:
    think: str
    selected: tuple[int, ...]
    answer: str


def _think_block(text: str) -> tuple[str | None, str]:
    """(thought, rest of the text after it). A missing ``</think>`` ends at the next tag."""
    start = text.find(_THINK_OPEN)
    if start < 0:
        return None, text
    body_start = start + len(_THINK_OPEN)
    end = text.find(_THINK_CLOSE, body_start)
    if end >= 0:
        return text[body_start:end].strip(), text[end + len(_THINK_CLOSE) :]
    # Tolerate an unclosed thought (or "</think" without ">") when an action or answer follows it.
    match = re.search(r"</think\b|<action>|<answer>|<select>", text[body_start:])
    if match is None:
        return None, text
    rest = text[body_start + match.start() :]
    if rest.startswith("</think"):
        rest = rest[len("</think") :].lstrip(">")
    return text[body_start : body_start + match.start()].strip(), rest


def parse_planner_turn(text: str) -> PlannerTurn | Malformed:
    """One planner reply: ``<think>`` then either searches in ``<action>`` or a final ``<answer>``."""
    if not isinstance(text, str) or not text.strip():
        return Malformed("planner_empty")
    think, rest = _think_block(text)
    if not think:
        return Malformed("planner_no_think", text[:200])
    # Stop at an observation the teacher invented for itself: it is ours to supply.
    cut = re.search(r"\n\s*(?:Obs(?:ervation)?\s*:|User\s*:)", rest)
    if cut is not None:
        rest = rest[: cut.start()]
    answer = extract_last(rest, "answer")
    actions = find_blocks(rest, "action")
    search_text = "\n".join(actions) if actions else rest
    queries = search_calls(search_text)
    if answer is not None and (queries or actions):
        return Malformed("planner_search_and_answer", rest[:200])
    if answer is not None:
        if not answer.strip():
            return Malformed("planner_empty_answer")
        return PlannerTurn(think=think, answer=answer.strip())
    if not queries:
        if SEARCH_WORD.search(search_text) or actions:
            return Malformed("planner_bad_search_call", search_text[:200])
        return Malformed("planner_no_action", rest[:200])
    if any(not q for q in queries):
        return Malformed("planner_empty_query", search_text[:200])
    return PlannerTurn(think=think, searches=tuple(queries))


def render_planner_turn(turn: PlannerTurn) -> str:
    """The canonical text of a planner turn (the paper's layout)."""
    head = f"{_THINK_OPEN}\n{turn.think}\n{_THINK_CLOSE}\n"
    if turn.is_final:
        return f"{head}<answer> {turn.answer} </answer>"
    calls = "\n".join(f"Search({_quote(q)})" for q in turn.searches)
    return f"{head}<action>\n{calls}\n</action>"


def _quote(query: str) -> str:
    return '"' + query.replace("\\", "\\\\").replace('"', '\\"') + '"'


NO_INFORMATION = "no relevant information found"


def parse_answer_sentence(text: str) -> str | Malformed:
    """Step (i) of the executor: the one-sentence answer to a sub-question."""
    if not isinstance(text, str) or not text.strip():
        return Malformed("executor_answer_empty")
    answer = extract_last(text, "answer")
    if answer is None:
        # An untagged reply is accepted if it is a single line: small teachers often drop the tags.
        bare = strip_thinking(text).strip()
        if "<" in bare or "\n" in bare or not bare:
            return Malformed("executor_answer_untagged", text[:200])
        answer = bare
    answer = " ".join(answer.split())
    if not answer:
        return Malformed("executor_answer_empty")
    if NO_INFORMATION in answer.lower():
        return Malformed("executor_no_information", answer)
    return answer


def _parse_indices(text: str) -> tuple[int, ...] | None:
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    parts = [p.strip() for p in re.split(r"[,\s]+", body) if p.strip()]
    if not parts or not all(re.fullmatch(r"\[?\d+\]?", p) for p in parts):
        return None
    return tuple(dict.fromkeys(int(p.strip("[]")) for p in parts))


def parse_executor_step(text: str, pool_size: int) -> ExecutorStep | Malformed:
    """Step (iii): ``<think>`` → ``<select>[i, ...]</select>`` → ``<answer>one sentence</answer>``."""
    if not isinstance(text, str) or not text.strip():
        return Malformed("executor_empty")
    think, rest = _think_block(text)
    if not think:
        return Malformed("executor_no_think", text[:200])
    select = extract_last(rest, "select")
    if select is None:
        return Malformed("executor_no_select", rest[:200])
    indices = _parse_indices(select)
    if indices is None:
        return Malformed("executor_bad_select", select[:200])
    if any(i >= pool_size for i in indices):
        return Malformed("executor_select_out_of_range", f"{indices} with {pool_size} facts")
    answer = extract_last(rest, "answer")
    if answer is None or not answer.strip():
        return Malformed("executor_no_answer", rest[:200])
    answer = " ".join(answer.split())
    if NO_INFORMATION in answer.lower():
        return Malformed("executor_no_information", answer)
    return ExecutorStep(think=think, selected=indices, answer=answer)


def render_executor_step(step: ExecutorStep) -> str:
    selected = ", ".join(str(i) for i in step.selected)
    return (
        f"{_THINK_OPEN}\n{step.think}\n{_THINK_CLOSE}\n<select>[{selected}]</select>\n<answer> {step.answer} </answer>"
    )
