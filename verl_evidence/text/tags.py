"""Protocol tags in model output: the last block of a tag, every block, the open/close events and whether they nest
properly, and the text after the thinking. Any string goes in; ``None`` means "no such block"."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

__all__ = ["block_sequence", "extract_last", "find_blocks", "strip_thinking", "tag_events"]


@lru_cache(maxsize=256)
def _tag_event_re(tags: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(t) for t in tags)
    return re.compile(rf"<(/?)({names})>")


def tag_events(text: str, tags: Iterable[str]) -> list[tuple[str, bool, int, int]]:
    """Every literal ``<tag>`` / ``</tag>`` of the given names, in order.

    Each event is ``(tag, is_close, start, end)`` with character offsets.
    """
    tags = tuple(tags)
    if not tags or not isinstance(text, str):
        return []
    return [(m.group(2), m.group(1) == "/", m.start(), m.end()) for m in _tag_event_re(tags).finditer(text)]


def block_sequence(text: str, tags: Iterable[str]) -> list[str] | None:
    """The named blocks of ``text`` in order, if they are well formed; else None.

    Well formed: every ``<tag>`` of the given names is closed by its own
    ``</tag>`` before any other listed tag opens or closes (no nesting, no
    stray or unclosed tags). Text between blocks is not inspected.
    """
    sequence: list[str] = []
    open_tag: str | None = None
    for tag, is_close, _, _ in tag_events(text, tags):
        if open_tag is None:
            if is_close:
                return None  # closes something never opened
            open_tag = tag
        else:
            if not is_close or tag != open_tag:
                return None  # nested open, or closes a different tag
            sequence.append(tag)
            open_tag = None
    if open_tag is not None:
        return None  # unclosed at the end
    return sequence


def find_blocks(text: str, tag: str) -> list[str]:
    """Contents of all complete ``<tag>...</tag>`` blocks, in order, stripped.

    Each close pairs with the nearest preceding unpaired open of the same tag
    after the previous block, so ``<a>x<a>y</a>`` yields ``["y"]`` and an
    unclosed ``<a>`` yields nothing.
    """
    blocks: list[str] = []
    open_end: int | None = None
    for _, is_close, start, end in tag_events(text, (tag,)):
        if is_close:
            if open_end is not None:
                blocks.append(text[open_end:start].strip())
                open_end = None
        else:
            open_end = end  # a later open supersedes an unclosed earlier one
    return blocks


def extract_last(text: str, tag: str) -> str | None:
    """Stripped content of the LAST complete ``<tag>...</tag>`` block; None if there is none."""
    if not isinstance(text, str):
        return None
    opening, closing = f"<{tag}>", f"</{tag}>"
    close = text.rfind(closing)
    # Same pairing as find_blocks: a block is a close whose nearest preceding tag is an open;
    # walk back over stray closes ("<a>x</a></a>" -> "x").
    while close >= 0:
        start = text.rfind(opening, 0, close)
        previous_close = text.rfind(closing, 0, close)
        if start > previous_close:
            return text[start + len(opening) : close].strip()
        close = previous_close
    return None


def strip_thinking(text: str) -> str:
    """Text after the last ``</think>``, or the text unchanged if there is none."""
    if not isinstance(text, str):
        return "" if text is None else str(text)
    idx = text.rfind("</think>")
    return text if idx < 0 else text[idx + len("</think>") :]
