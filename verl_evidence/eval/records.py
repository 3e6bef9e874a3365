"""One evaluated example: what the runner writes, the cache stores and the metrics read.

A record is flat and JSON-serialisable so that the results cache is a plain
JSONL file a user can inspect with ``jq``. Fields a rollout did not produce
stay ``None`` and the metrics that need them skip the record.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EvalRecord"]


@dataclass
class EvalRecord:
    """The outcome of one policy on one example, plus every reward it received.

    - ``example_id`` is unique within a policy's run (the runner prefixes the
      rollout kind when one question is run through several loops).
    - ``prediction``: the text of the final ``<answer>`` block, ``None`` if the
      response has none.
    - ``evidence``: the evidence the policy produced (EviOmni's ``<extract>``,
      GRACE's ``<evidence>``, the last EviNote ``<summary>``), used for answer recall.
    - ``passage_tokens`` / ``evidence_tokens``: sum of L_p over the retrieved
      passages and L_e, for EviOmni's compression ratio.
    - ``context_tokens`` / ``raw_context_tokens``: tokens of retrieved text the
      search loop appended (after extraction) and before extraction.
    - ``answerable``: GRACE's label (gold evidence in the context); ``refused``:
      the policy declared the evidence insufficient (GRACE's ``<llm>`` path).
    - ``rewards``: reward-manager name -> ``{"score": ..., component: ...}``.
    - ``reader_prediction``: the separate reader's answer from ``evidence`` (EviOmni/LEAR's
      evaluation, ``eval --reader``); ``reader`` identifies the reader and its prompt.
    - ``bertscore_f1``: BERTScore F1 of ``prediction`` against the gold answers (GRACE's F1,
      ``eval --bertscore``), computed with ``bertscore_model``.
    - ``judge_correct``: the LLM judge's verdict (GRACE's LJ, ``eval --judge``): a right answer on
      an answerable example, a signalled lack of evidence on an unanswerable one; ``judge`` names it.
    - ``decoding``: the sampling the policy generated with (``eval --decoding``: temperature, top_p, top_k
      and where they come from); ``None`` for replayed texts.
    """

    policy: str
    example_id: str
    data_source: str
    rollout: str
    question: str
    golden_answers: list[str]
    response: str = ""
    prediction: str | None = None
    case: str | None = None
    question_id: str | None = None
    answerable: bool | None = None
    refused: bool | None = None
    num_searches: int | None = None
    summary_count: int | None = None
    eqr: float | None = None
    evidence: str | None = None
    evidence_tokens: int | None = None
    passage_tokens: int | None = None
    context_tokens: int | None = None
    raw_context_tokens: int | None = None
    rewards: dict[str, dict[str, float]] = field(default_factory=dict)
    error: str | None = None
    reader: str | None = None
    reader_prediction: str | None = None
    bertscore_model: str | None = None
    bertscore_f1: float | None = None
    judge: str | None = None
    judge_correct: bool | None = None
    decoding: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        # JSON has no NaN/inf; a non-finite reward component is stored as null.
        out["rewards"] = {
            name: {k: (float(v) if _finite(v) else None) for k, v in comps.items()}
            for name, comps in self.rewards.items()
        }
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> EvalRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        missing = {"policy", "example_id", "data_source", "rollout", "question", "golden_answers"} - set(row)
        if missing:
            raise ValueError(f"evaluation record lacks required keys {sorted(missing)}")
        return cls(**{k: v for k, v in row.items() if k in known})


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
