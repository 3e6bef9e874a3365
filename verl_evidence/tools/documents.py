"""Retrieved documents as the model sees them, their ids and texts.

Two layouts (:data:`DOCUMENT_FORMATS`), picked by the prompt the model reads them with:

- ``ours``: ``Doc 1 (Title: Nile) The Nile flows north.`` lines, joined by newlines; the title's
  surrounding quotes and the text's outer whitespace removed.
- ``search_r1``: Search-R1's own layout, so a checkpoint trained with Search-R1's prompt is evaluated
  (or trained further) on the input it learnt from: ``Doc 1(Title: "Nile") The Nile flows north.``, no
  space before the parenthesis, the title exactly as the first line of ``contents`` (FlashRAG's wiki-18
  keeps its quotes), the text the remaining lines as they are, every document ending in a newline.

Pure (no verl import): data preparation, the smoke runs and the CLI format
passages the way the search tool and the agent loops do, without loading verl.
The title is the first line of the FlashRAG ``contents`` field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

OURS, SEARCH_R1 = "ours", "search_r1"
DOCUMENT_FORMATS = (OURS, SEARCH_R1)
# The layout each prompt's passages are shown in: Search-R1's prompt gets Search-R1's layout, every other prompt
# (named as verl_evidence.prompts names them) ours.
PROMPT_DOCUMENT_FORMATS: Mapping[str, str] = {"search_r1": SEARCH_R1}


def document_format_for_prompt(prompt: str | None) -> str:
    """The layout passages are shown in under the packaged prompt ``prompt`` (None or a file: ours)."""
    return PROMPT_DOCUMENT_FORMATS.get(prompt or "", OURS)


def check_document_format(document_format: str) -> str:
    if document_format not in DOCUMENT_FORMATS:
        raise ValueError(f"document_format must be one of {', '.join(DOCUMENT_FORMATS)}, got {document_format!r}")
    return document_format


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG ``contents`` is ``"Title\\ntext"``; a single line is text without a title."""
    title, sep, text = (contents or "").partition("\n")
    if not sep:
        return "", title.strip()
    return title.strip().strip('"'), text.strip()


def _contents(item: object) -> str:
    document = item.get("document", item) if isinstance(item, dict) else {}
    return str((document or {}).get("contents", ""))


def format_documents(results: Sequence[dict], document_format: str = OURS) -> str:
    """One query's results in ``document_format`` (:data:`DOCUMENT_FORMATS`)."""
    if check_document_format(document_format) == SEARCH_R1:
        # Search-R1 splits at the first newline and keeps both parts as they are (a single line is all title).
        parts = [_contents(item).partition("\n") for item in results]
        return "".join(f"Doc {i}(Title: {title}) {text}\n" for i, (title, _, text) in enumerate(parts, start=1))
    lines = []
    for index, item in enumerate(results, start=1):
        title, text = split_contents(_contents(item))
        lines.append(f"Doc {index} (Title: {title}) {text}")
    return "\n".join(lines)


def format_search_results(
    queries: Sequence[str], results: Sequence[Sequence[dict]], document_format: str = OURS
) -> str:
    """One block per query; a single query is shown without a header, like Search-R1."""
    if len(queries) == 1:
        return format_documents(results[0], document_format)
    return "\n\n".join(
        f"Results for {query!r}:\n{format_documents(docs, document_format)}"
        for query, docs in zip(queries, results, strict=True)
    )


def document_ids(results: Sequence[dict]) -> list[str]:
    return [str((item.get("document") or {}).get("id", "")) for item in results]


def document_texts(results: Sequence[dict]) -> list[str]:
    """Each result's passage text, without its title (what masking must hide wherever it is copied)."""
    texts = [split_contents(_contents(item))[1] for item in results]
    return [t for t in texts if t]


__all__ = [
    "DOCUMENT_FORMATS",
    "PROMPT_DOCUMENT_FORMATS",
    "check_document_format",
    "document_format_for_prompt",
    "document_ids",
    "document_texts",
    "format_documents",
    "format_search_results",
    "split_contents",
]
