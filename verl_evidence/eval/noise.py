"""EviOmni's noise-robustness test (Fig. 5; LEAR Fig. 6): k irrelevant passages added to each question's own.

The papers pair each test question's 5 retrieved passages with k randomly sampled irrelevant ones, k in
{0, 2, 4, 6, 8}. ``eval --noise-passages 0,2,4,6,8`` builds one copy of every EviOmni/LEAR row per k:

- the k passages are drawn from the corpus, never one of the row's own passages nor one that contains a gold
  answer (normalized), with a generator seeded by (seed, k, example id): the same draw on every run;
- they follow the row's passages in ``extra_info.passages`` (the EviOmni loop renders the prompt from them) and in
  the rendered prompt, and ``eviomni_len_p`` counts them;
- the copy's data source is ``<source>+noise<k>`` (``nq+noise4``), so every k is its own column group of the
  ordinary results table and a row of ``eval --paper eviomni --table fig5``; k = 0 keeps the row as it is, under
  ``<source>+noise0``.
"""

from __future__ import annotations

import copy
import hashlib
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl_evidence.rewards.qa_metrics import normalize

__all__ = ["NOISE_SUFFIX", "noise_level", "parse_noise_levels", "with_noise_passages"]

NOISE_SUFFIX = "+noise"
_SOURCE_RE = re.compile(r"^(?P<source>.+)\+noise(?P<k>\d+)$")
MAX_NOISE = 64


def parse_noise_levels(text: str) -> tuple[int, ...]:
    """``"0,2,4"`` -> (0, 2, 4); a clear ValueError for anything else."""
    try:
        levels = tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--noise-passages takes comma-separated counts such as 0,2,4,6,8, got {text!r}") from None
    if not levels or any(k < 0 or k > MAX_NOISE for k in levels) or len(set(levels)) != len(levels):
        raise ValueError(f"--noise-passages: distinct counts from 0 to {MAX_NOISE}, got {text!r}")
    return levels


def noise_level(data_source: str) -> tuple[str, int | None]:
    """(``nq``, 4) for ``nq+noise4``; (source, None) for a source without added noise."""
    match = _SOURCE_RE.match(str(data_source))
    if match is None:
        return str(data_source), None
    return match["source"], int(match["k"])


def _golds(row: Mapping[str, Any]) -> list[str]:
    from verl_evidence.text.ground_truth import coerce_ground_truth

    truth = coerce_ground_truth((row.get("reward_model") or {}).get("ground_truth"))
    return [normalize(g) for g in truth["target"] if normalize(g)]


def _seeded(seed: int, k: int, key: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}\x1f{k}\x1f{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _irrelevant(corpus: Mapping[str, str], own: set[str], golds: list[str]) -> list[str]:
    ids = []
    for passage_id, text in corpus.items():
        if passage_id in own:
            continue
        if golds:
            body = f" {normalize(text)} "
            if any(f" {gold} " in body for gold in golds):
                continue  # it would answer the question: not noise
        ids.append(passage_id)
    return ids


def with_noise_passages(
    rows: Sequence[dict[str, Any]],
    corpus: Mapping[str, str],
    levels: Sequence[int],
    count_tokens: Callable[[str], int] | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One copy of each row with ``extra_info.passages`` per level k (module docstring); other rows unchanged.

    ``corpus``: ``{id: "Title\\ntext"}`` (``read_corpus``); ``count_tokens`` recounts ``eviomni_len_p``.
    """
    from verl_evidence.dataprep.templates import format_passages

    if not any((row.get("extra_info") or {}).get("passages") for row in rows):
        raise ValueError("--noise-passages adds passages to EviOmni/LEAR rows; none of these rows has passages")
    out: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        extra = row.get("extra_info") or {}
        passages = extra.get("passages")
        if not passages:
            out.append(row)
            continue
        passages = [
            p if isinstance(p, dict) else {"id": f"row-{i}", "contents": str(p)} for i, p in enumerate(passages)
        ]
        own = {str(p.get("id")) for p in passages} | {str(p.get("contents")) for p in passages}
        candidates = _irrelevant(corpus, own, _golds(row))
        contents = [str(p["contents"]) for p in passages]
        key = str(extra.get("id", index))
        for k in levels:
            if k > len(candidates):
                raise ValueError(
                    f"--noise-passages {k}: the corpus has only {len(candidates)} passages irrelevant to row {key!r}"
                )
            noise_ids = _seeded(seed, k, key).sample(sorted(candidates), k)
            noisy = copy.deepcopy(row)
            noisy_extra = noisy.setdefault("extra_info", {})
            added = [{"id": passage_id, "contents": corpus[passage_id]} for passage_id in noise_ids]
            noisy_extra["passages"] = passages + added
            noisy_extra["noise_passages"] = k
            noisy_extra["id"] = f"{key}{NOISE_SUFFIX}{k}"  # its own example id (and cache entry) per k
            noisy_extra["noise_passage_ids"] = list(noise_ids)
            noisy["data_source"] = f"{row.get('data_source', 'unknown')}{NOISE_SUFFIX}{k}"
            before, after = format_passages(contents), format_passages(contents + [corpus[i] for i in noise_ids])
            for message in noisy.get("prompt") or []:
                if isinstance(message, dict) and before in str(message.get("content", "")):
                    message["content"] = str(message["content"]).replace(before, after)
            if count_tokens is not None:
                noisy_extra["eviomni_len_p"] = count_tokens(after)
            out.append(noisy)
    return out
