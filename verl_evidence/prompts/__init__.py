"""Prompt templates as swappable text files.

Every prompt the project sends to a model lives in a ``.txt`` file in this
directory, written in the project's own words with the structure of the paper
it serves. Users replace any of them with a file of their own (for instance a
paper's exact wording) by passing a path wherever a prompt name is accepted.

Placeholders are ``{name}``; :func:`render_prompt` fills them in one pass, so
braces inside the inserted values (passages, questions) are never touched.

Roles: a file is one user message, unless it has role lines ``[[system]]``,
``[[user]]`` or ``[[assistant]]`` (alone on a line): then each line opens a
message of that role, holding the text up to the next role line
(:func:`split_roles`, :func:`render_messages`). GRACE's prompt is a system
and a user message, as in the paper; EviPath's demonstrations are user and
assistant turns. A paper's exact text, pasted into a file with the same role
lines, replaces a packaged prompt.

Packaged prompts:

====================== ==========================================================
``search_r1``          Search-R1 style search agent: {question}
``evinote_sen``        EviNote-RAG search agent with supportive-evidence notes: {question}
``evinote_naive_*``, ``evinote_force_summary``  EviNote's ablation instructions (Tables 2-5): {question}
``eviomni_reason_extract``  EviOmni policy prompt: {question} {passages}
``eviomni_answer``     EviOmni masked-answer prompt for o_r / o_e: {question} {passages} {rationale} {evidence}
``eviomni_reader``, ``eviomni_closed_book``, ``eviomni_cot``  QA generator, Zero, CoT: {question} [{document}]
``evidence_extractor`` agentic evidence extraction: {question} {thought} {query} {passages}
``grace``              GRACE evidence-validation prompt, system + user: {question} {context}
``grace_three_shot``   GRACE Table 4's three-shot baseline prompt (plain answers): {question} {context}
``grace_three_shot_tags``  the same demonstrations in GRACE's prompt and tags: {question} {context}
``evipath_*``          EviPath synthesis, executor and planner prompts (docs/methods/evipath.md)
====================== ==========================================================
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
ROLES = ("system", "user", "assistant")
_ROLE_LINE = re.compile(r"^\[\[(system|user|assistant)\]\][ \t]*$", re.MULTILINE)


def available_prompts() -> list[str]:
    return sorted(p.stem for p in PROMPT_DIR.glob("*.txt"))


@functools.lru_cache(maxsize=64)
def load_prompt(name_or_path: str | Path) -> str:
    """The template text of a packaged prompt name (``"search_r1"``) or of a file path."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate.read_text(encoding="utf-8")
    packaged = PROMPT_DIR / f"{Path(str(name_or_path)).stem}.txt"
    if packaged.is_file() and str(name_or_path) in (packaged.stem, packaged.name):
        return packaged.read_text(encoding="utf-8")
    raise FileNotFoundError(
        f"prompt {str(name_or_path)!r} is neither a file nor a packaged prompt; packaged: {available_prompts()}"
    )


def placeholders(template: str) -> set[str]:
    return set(_PLACEHOLDER.findall(template))


def has_roles(template: str) -> bool:
    return _ROLE_LINE.search(template) is not None


def split_roles(template: str) -> list[tuple[str, str]]:
    """``[(role, text), ...]`` in file order; a template without role lines is one ``user`` message.

    Each message's text is stripped of the blank lines around it. Text before the
    first role line, or a role line with nothing under it, is an error: a swapped-in
    file fails when it is loaded, not in the middle of a run.
    """
    marks = list(_ROLE_LINE.finditer(template))
    if not marks:
        return [("user", template)]
    if template[: marks[0].start()].strip():
        raise ValueError("prompt text before the first role line ([[system]], [[user]] or [[assistant]])")
    messages = []
    for mark, following in zip(marks, [*marks[1:], None]):
        text = template[mark.end() : following.start() if following else len(template)].strip("\n")
        if not text.strip():
            raise ValueError(f"prompt role line [[{mark.group(1)}]] has no text under it")
        messages.append((mark.group(1), text))
    return messages


def render_messages(template: str, **fields: str) -> list[dict[str, str]]:
    """The chat messages of a template, each with its placeholders filled (:func:`render_prompt`)."""
    return [{"role": role, "content": render_prompt(text, **fields)} for role, text in split_roles(template)]


def check_placeholders(
    template: str, required: set[str] | list[str], name: str = "prompt", roles: bool = False
) -> None:
    """Fail early (at loop construction) when a swapped-in template lacks a field the loop fills.

    ``roles=False``: the caller uses the template as one message, so role lines are refused.
    """
    if not roles and has_roles(template):
        raise ValueError(f"{name} template has role lines ([[system]] ...), but this setting takes one message")
    missing = set(required) - placeholders(template)
    if missing:
        raise ValueError(f"{name} template lacks placeholder(s) {sorted('{' + m + '}' for m in missing)}")


def render_prompt(template: str, **fields: str) -> str:
    """Fill ``{name}`` placeholders in a single pass; unknown placeholders are left as they are."""
    return _PLACEHOLDER.sub(lambda m: str(fields[m.group(1)]) if m.group(1) in fields else m.group(0), template)
