"""Where generated token ids end: at a stop string or a stop token (the tokenizer is only asked to ``decode``).
A generation helper of the rollouts and the CPU backends, kept out of the rewards layer."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["cut_at_stop"]


def cut_at_stop(token_ids: list[int], tokenizer, stops: Sequence[str], stop_ids: set[int]) -> tuple[list[int], str]:
    """Cut ``token_ids`` after the first token that ends a stop string or is a stop token.

    Returns the kept ids and why generation ended: ``"stop"`` (stop string or
    stop token) or ``"length"`` (no stop seen).
    """
    # Every token decodes to at least one character, so a stop string that the
    # current token completes lies within the last len(stop) tokens: decoding
    # that window keeps the scan linear.
    window = max((len(s) for s in stops), default=0) + 1
    for index, token_id in enumerate(token_ids):
        if token_id in stop_ids:
            return token_ids[: index + 1], "stop"
        if stops:
            tail = tokenizer.decode(token_ids[max(0, index + 1 - window) : index + 1], skip_special_tokens=False)
            if any(s in tail for s in stops):
                return token_ids[: index + 1], "stop"
    return list(token_ids), "length"
