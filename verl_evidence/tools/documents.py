"""Retrieved documents as the model sees them: ``Doc i (Title: <title>) <text>``, their ids and texts.

Pure (no verl import): data preparation, the smoke runs and the CLI format
passages the way the search tool and the agent loops do, without loading verl.
The title is the first line of the FlashRAG ``contents`` field.
"""

from __future__ import annotations

from collections.abc import Sequence


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG ``contents`` is ``"Title\\ntext"``; a single line is text without a title."""
    title, sep, text = (contents or "").partition("\n")
    if not sep:
        return "", title.strip()
    return title.strip().strip('"'), text.strip()


def format_documents(results: Sequence[dict]) -> str:
    """``Doc 1 (Title: T) text`` lines for one query's results."""
    lines = []
    for index, item in enumerate(results, start=1):
        document = item.get("document", item) if isinstance(item, dict) else {}
        title, text = split_contents(str(document.get("contents", "")))
        lines.append(f"Doc {index} (Title: {title}) {text}")
    return "\n".join(lines)


def format_search_results(queries: Sequence[str], results: Sequence[Sequence[dict]]) -> str:
    """One block per query; a single query is shown without a header, like Search-R1."""
    if len(queries) == 1:
        return format_documents(results[0])
    return "\n\n".join(
        f"Results for {query!r}:\n{format_documents(docs)}" for query, docs in zip(queries, results, strict=True)
    )


def document_ids(results: Sequence[dict]) -> list[str]:
    return [str((item.get("document") or {}).get("id", "")) for item in results]


def document_texts(results: Sequence[dict]) -> list[str]:
    """Each result's passage text, without its title (what masking must hide wherever it is copied)."""
    texts = [split_contents(str((item.get("document", item) or {}).get("contents", "")))[1] for item in results]
    return [t for t in texts if t]


__all__ = ["document_ids", "document_texts", "format_documents", "format_search_results", "split_contents"]
