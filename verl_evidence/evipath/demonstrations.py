"""Few-shot demonstrations for the teacher, as EviPath's synthesis prompts show them (Tables 8-9).

The paper gives the teacher its system prompt, then worked dialogues (user:
question, answer and evidence; assistant: think -> action; user: observations;
... ; assistant: think -> answer), then the record at hand. Ours are written in
that format, on facts of our own, in swappable prompt files: demonstrations
separated by ``[[demonstration]]`` lines, each a dialogue in role lines
(``[[user]]`` / ``[[assistant]]``, see :mod:`verl_evidence.prompts`) that starts
with the user and ends with the assistant.
"""

from __future__ import annotations

import re

from verl_evidence.prompts import load_prompt, split_roles

Message = dict[str, str]
DEMONSTRATION_LINE = re.compile(r"^\[\[demonstration\]\][ \t]*$", re.MULTILINE)
DEFAULT_DEMONSTRATIONS = 2  # of the three packaged per step; the paper's tables print one, its text says "few-shot"


def load_demonstrations(name_or_path: str) -> list[list[Message]]:
    """Every demonstration of a packaged name or file, in order, each a list of chat messages."""
    text = load_prompt(name_or_path)
    parts = DEMONSTRATION_LINE.split(text)
    if parts[0].strip():
        raise ValueError(f"demonstrations {name_or_path!r}: text before the first [[demonstration]] line")
    demonstrations = []
    for number, part in enumerate(parts[1:], start=1):
        try:
            messages = [{"role": role, "content": body} for role, body in split_roles(part)]
        except ValueError as err:
            raise ValueError(f"demonstrations {name_or_path!r}, number {number}: {err}") from err
        roles = [m["role"] for m in messages]
        expected = ["user", "assistant"] * (len(roles) // 2)
        if roles != expected or not roles:
            raise ValueError(
                f"demonstrations {name_or_path!r}, number {number}: turns must alternate user/assistant, "
                f"starting with the user and ending with the assistant; got {roles}"
            )
        demonstrations.append(messages)
    if not demonstrations:
        raise ValueError(f"demonstrations {name_or_path!r}: no [[demonstration]] in it")
    return demonstrations


def demonstration_messages(name_or_path: str, count: int) -> list[Message]:
    """The first ``count`` demonstrations as one run of messages (``count`` = 0: none, zero-shot)."""
    if count < 0:
        raise ValueError(f"the number of demonstrations must be >= 0, got {count}")
    if count == 0:
        return []
    demonstrations = load_demonstrations(name_or_path)
    if count > len(demonstrations):
        raise ValueError(f"asked for {count} demonstrations, {name_or_path!r} has {len(demonstrations)}")
    return [message for demonstration in demonstrations[:count] for message in demonstration]
