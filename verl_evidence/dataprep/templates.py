"""Chat prompt templates used to write the ``prompt`` column.

Templates are the packaged prompts of ``verl_evidence.prompts`` (or any file a
user passes instead): ``{question}`` and, for methods that put passages in the
prompt, ``{passages}`` (EviOmni/LEAR) or ``{context}`` (GRACE). Passages are
laid out exactly as the search tool shows results (``Doc i (Title: t) text``),
so a policy sees the same format in every method.
"""

from __future__ import annotations

from collections.abc import Sequence

from verl_evidence.dataprep.records import DataPrepError
from verl_evidence.prompts import load_prompt, placeholders, render_prompt, split_roles
from verl_evidence.tools.documents import format_documents

# The packaged prompt each method's rows are written with.
DEFAULT_PROMPTS: dict[str, str] = {
    "search_r1": "search_r1",
    "evinote": "evinote_sen",
    "eviomni": "eviomni_reason_extract",
    "lear": "eviomni_reason_extract",
    "grace": "grace",
}
PASSAGE_FIELDS = ("passages", "context")


def load_template(spec: str) -> str:
    """Template text from a file path, a packaged prompt name, or a method name (its default prompt)."""
    try:
        text = load_prompt(DEFAULT_PROMPTS.get(spec, spec))
    except FileNotFoundError as err:
        raise DataPrepError(str(err)) from err
    check_template(text, spec)
    return text


def check_template(text: str, spec: str) -> None:
    try:
        roles = [role for role, _ in split_roles(text)]
    except ValueError as err:
        raise DataPrepError(f"prompt template {spec!r}: {err}") from err
    if roles[-1] != "user":
        raise DataPrepError(f"prompt template {spec!r} must end with a user message, ends with {roles[-1]!r}")
    fields = placeholders(text)
    if "question" not in fields:
        raise DataPrepError(f"prompt template {spec!r} has no {{question}} placeholder")
    unknown = fields - {"question", *PASSAGE_FIELDS}
    if unknown:
        raise DataPrepError(f"prompt template {spec!r} has placeholder(s) data prep cannot fill: {sorted(unknown)}")


def format_passages(passages: Sequence[str]) -> str:
    """``Doc i (Title: t) text`` lines, the search tool's own layout."""
    return format_documents([{"document": {"contents": contents}} for contents in passages])


def render_messages(template: str, question: str, passages: Sequence[str] | None = None) -> list[dict[str, str]]:
    """The row's chat prompt: one message per role section of ``template`` (one user message without roles)."""
    needs_passages = bool(placeholders(template) & set(PASSAGE_FIELDS))
    if needs_passages and passages is None:
        raise DataPrepError("this prompt template needs passages ({passages} or {context}) but none were given")
    text = format_passages(passages or ())
    # A template file's final newline is not part of the turn.
    return [
        {"role": role, "content": render_prompt(body, question=question, passages=text, context=text).rstrip()}
        for role, body in split_roles(template)
    ]


def render(template: str, question: str, passages: Sequence[str] | None = None) -> str:
    """The last user message of :func:`render_messages` (the whole prompt for a template without role lines)."""
    return render_messages(template, question, passages)[-1]["content"]
