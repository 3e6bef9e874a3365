"""Prompt templates as swappable text files.

Every prompt the project sends to a model lives in a ``.txt`` file in this
directory, written in the project's own words with the structure of the paper
it serves. Users replace any of them with a file of their own (for instance a
paper's exact wording) by passing a path wherever a prompt name is accepted.

Placeholders are ``{name}``; :func:`render_prompt` fills them in one pass, so
braces inside the inserted values (passages, questions) are never touched.

Packaged prompts:

====================== ==========================================================
``search_r1``          Search-R1 style search agent: {question}
``evinote_sen``        EviNote-RAG search agent with supportive-evidence notes: {question}
``eviomni_reason_extract``  EviOmni policy prompt: {question} {passages}
``eviomni_answer``     EviOmni masked-answer prompt for o_r / o_e: {question} {passages} {rationale} {evidence}
``evidence_extractor`` agentic evidence extraction: {question} {thought} {query} {passages}
``grace``              GRACE evidence-or-recall prompt: {context} {question}
====================== ==========================================================
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


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


def check_placeholders(template: str, required: set[str] | list[str], name: str = "prompt") -> None:
    """Fail early (at loop construction) when a swapped-in template lacks a field the loop fills."""
    missing = set(required) - placeholders(template)
    if missing:
        raise ValueError(f"{name} template lacks placeholder(s) {sorted('{' + m + '}' for m in missing)}")


def render_prompt(template: str, **fields: str) -> str:
    """Fill ``{name}`` placeholders in a single pass; unknown placeholders are left as they are."""
    return _PLACEHOLDER.sub(lambda m: str(fields[m.group(1)]) if m.group(1) in fields else m.group(0), template)
