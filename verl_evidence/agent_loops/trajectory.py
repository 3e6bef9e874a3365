"""Token bookkeeping of a multi-turn trajectory: response ids, loss mask and log-probs grow together, and the spans
of retrieved tokens are recorded for the trainer's masking check; plus the chat-template probe for where an assistant
turn ends."""

from __future__ import annotations

import functools

from verl_evidence.agent_loops.common import encode_cached

__all__ = ["Trajectory", "assistant_turn_end_ids"]


@functools.lru_cache(maxsize=16)
def _turn_end_text(tokenizer, template_kwargs: tuple) -> str:
    sentinel = "ZQXJ-END-OF-CONTENT"
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": sentinel}],
        tokenize=False,
        add_generation_prompt=False,
        **dict(template_kwargs),
    )
    return rendered[rendered.rindex(sentinel) + len(sentinel) :]


def assistant_turn_end_ids(tokenizer, chat_template_kwargs: dict | None = None) -> list[int]:
    """Tokens the chat template puts after an assistant message's content (ChatML: ``<|im_end|>\n``)."""
    kwargs = tuple(sorted((chat_template_kwargs or {}).items()))
    return encode_cached(tokenizer, _turn_end_text(tokenizer, kwargs))


class Trajectory:
    """Token bookkeeping: response ids, mask and logprobs grow together."""

    def __init__(self, response_length: int) -> None:
        self.response_length = response_length
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.has_logprobs = False
        # [start, end) response positions of each observation appended after a search (loss mask 0):
        # what the trainer's masking check (verl_evidence.trainer.step_metrics) reads, independently of the mask
        self.retrieved_spans: list[list[int]] = []

    @property
    def remaining(self) -> int:
        return self.response_length - len(self.ids)

    def add_policy(self, ids: list[int], logprobs: list[float] | None) -> None:
        if logprobs is not None:
            if not self.has_logprobs and self.ids:
                self.logprobs = [0.0] * len(self.ids)
            self.has_logprobs = True
            self.logprobs.extend(logprobs[: len(ids)] + [0.0] * (len(ids) - len(logprobs)))
        elif self.has_logprobs:
            self.logprobs.extend([0.0] * len(ids))
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))

    def drop_last(self, n: int) -> None:
        """Remove the last ``n`` tokens (a chat-template boundary the builder replaces)."""
        if n > 0:
            del self.ids[-n:], self.mask[-n:]
            if self.has_logprobs:
                del self.logprobs[-n:]
            end = len(self.ids)
            self.retrieved_spans = [[a, min(b, end)] for a, b in self.retrieved_spans if a < end]

    def add_context(self, ids: list[int], retrieved: bool = False) -> int:
        """Append tool/system tokens (mask 0) up to the budget; returns how many fit.

        ``retrieved``: the tokens are a search's observation (recorded in :attr:`retrieved_spans`).
        """
        ids = ids[: max(0, self.remaining)]
        if retrieved and ids:
            self.retrieved_spans.append([len(self.ids), len(self.ids) + len(ids)])
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        if self.has_logprobs:
            self.logprobs.extend([0.0] * len(ids))
        return len(ids)
