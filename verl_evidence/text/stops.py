"""Where generated token ids end: at a stop string or a stop token (the tokenizer is only asked to ``decode``).
A generation helper of the rollouts and the CPU backends, kept out of the rewards layer."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["cut_at_stop", "ends_at_stop"]


def ends_at_stop(token_ids: Sequence[int], tokenizer, stops: Sequence[str], stop_ids: set[int]) -> bool:
    """Whether the last of ``token_ids`` is a stop token or completes a stop string.

    Every token decodes to at least one character, so a stop string that the last token completes lies within the
    last len(stop) tokens: decoding that window keeps a scan linear.
    """
    if token_ids[-1] in stop_ids:
        return True
    if not stops:
        return False
    window = max(len(s) for s in stops) + 1
    tail = tokenizer.decode(list(token_ids[-window:]), skip_special_tokens=False)
    return any(s in tail for s in stops)


def cut_at_stop(token_ids: list[int], tokenizer, stops: Sequence[str], stop_ids: set[int]) -> tuple[list[int], str]:
    """Cut ``token_ids`` after the first token that ends a stop string or is a stop token (:func:`ends_at_stop`).

    Returns the kept ids and why generation ended: ``"stop"`` (stop string or
    stop token) or ``"length"`` (no stop seen). The kept ids end with the token that completes the stop string, as
    vLLM and SGLang return it, even when that token carries characters past it (Qwen's ``'>\\n\\n'``): decide
    whether a stop was reached from this reason, never from the decoded text's last characters.
    """
    window = max((len(s) for s in stops), default=0) + 1  # what ends_at_stop reads: no longer slices, a linear scan
    for index in range(len(token_ids)):
        if ends_at_stop(token_ids[max(0, index + 1 - window) : index + 1], tokenizer, stops, stop_ids):
            return token_ids[: index + 1], "stop"
    return list(token_ids), "length"
