"""Evaluation metrics over :class:`~verl_evidence.eval.records.EvalRecord` lists.

Pure functions: records in, numbers out. Each metric skips the records that
lack what it needs and returns ``None`` when no record qualifies, so a table
shows "n/a" rather than a misleading 0.

Definitions (see docs/evaluation.md):

- EM / F1: SQuAD normalisation (:mod:`verl_evidence.rewards.qa_metrics`), max over
  gold answers; a missing answer scores 0.
- answer recall (EviOmni): a gold answer occurs in the policy's evidence.
- compression ratio (EviOmni eq. 9): per example ``sum(L_p) / L_e``, averaged
  over the examples with ``L_e > 0``; for the search loop the raw retrieved
  tokens over the appended (extracted) tokens.
- average searches; note rate = share of search-loop responses with at least
  one ``<summary>``; mean EQR over the examples the EviNote judge scored.
- GRACE: answerable EM/F1 over answerable examples; an answerable example is
  *correct* when the policy did not refuse and its answer is an exact match;
  refusal accuracy = share of unanswerable examples refused; overall accuracy =
  correct-or-rightly-refused over all labelled examples; balanced accuracy =
  mean of the answerable accuracy and the refusal accuracy.
- reader EM / F1 (EviOmni/LEAR's evaluation): EM / F1 of the separate reader's
  answer from the evidence, over the examples the reader answered.
- GRACE as its paper scores it: BERTScore F1 over the answerable examples that
  have one; the LLM judge's accuracy on answerable and on unanswerable examples,
  its overall accuracy (verdicts over all judged examples) and balanced accuracy
  (mean of the two), the paper's Acc. and B. Acc.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from statistics import fmean

from verl_evidence.eval.records import EvalRecord
from verl_evidence.rewards.qa_metrics import answer_recall, exact_match, f1_score

__all__ = [
    "ALL_SOURCES",
    "METRIC_NAMES",
    "answer_recall_rate",
    "average_searches",
    "compression_ratio",
    "exact_match_rate",
    "example_compression_ratio",
    "f1_mean",
    "grace_metrics",
    "group_by",
    "judged_grace_metrics",
    "mean_context_tokens",
    "mean_eqr",
    "metrics_by_source",
    "note_rate",
    "reader_metrics",
    "reward_means",
    "summarize",
]

ALL_SOURCES = "all"

# Column order of the metrics tables.
METRIC_NAMES: tuple[str, ...] = (
    "n",
    "em",
    "f1",
    "answer_recall",
    "compression_ratio",
    "avg_searches",
    "note_rate",
    "mean_eqr",
    "answerable_em",
    "answerable_f1",
    "refusal_accuracy",
    "overall_accuracy",
    "balanced_accuracy",
    "reader_em",
    "reader_f1",
    "bertscore_f1",
    "judge_answerable",
    "judge_unanswerable",
    "judge_accuracy",
    "judge_balanced_accuracy",
)


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return fmean(values) if values else None


def record_em(record: EvalRecord) -> float:
    return exact_match(record.prediction or "", record.golden_answers)


def record_f1(record: EvalRecord) -> float:
    return f1_score(record.prediction or "", record.golden_answers)


def exact_match_rate(records: Sequence[EvalRecord]) -> float | None:
    return _mean(record_em(r) for r in records)


def f1_mean(records: Sequence[EvalRecord]) -> float | None:
    return _mean(record_f1(r) for r in records)


def answer_recall_rate(records: Sequence[EvalRecord]) -> float | None:
    """Share of the examples with evidence whose evidence contains a gold answer."""
    return _mean(answer_recall(r.evidence, r.golden_answers) for r in records if r.evidence is not None)


def example_compression_ratio(record: EvalRecord) -> float | None:
    """``sum(L_p) / L_e`` for one example, or ``None`` when it is undefined (no evidence tokens)."""
    if record.passage_tokens is not None and record.evidence_tokens is not None:
        return record.passage_tokens / record.evidence_tokens if record.evidence_tokens > 0 else None
    if record.raw_context_tokens is not None and record.context_tokens is not None:
        return record.raw_context_tokens / record.context_tokens if record.context_tokens > 0 else None
    return None


def compression_ratio(records: Sequence[EvalRecord]) -> float | None:
    ratios = (example_compression_ratio(r) for r in records)
    return _mean(cr for cr in ratios if cr is not None)


def average_searches(records: Sequence[EvalRecord]) -> float | None:
    return _mean(r.num_searches for r in records if r.num_searches is not None)


def note_rate(records: Sequence[EvalRecord]) -> float | None:
    return _mean(1.0 if r.summary_count > 0 else 0.0 for r in records if r.summary_count is not None)


def mean_eqr(records: Sequence[EvalRecord]) -> float | None:
    return _mean(r.eqr for r in records if r.eqr is not None)


def mean_context_tokens(records: Sequence[EvalRecord]) -> float | None:
    return _mean(r.context_tokens for r in records if r.context_tokens is not None)


def grace_metrics(records: Sequence[EvalRecord]) -> dict[str, float | None]:
    """Answerable EM/F1, refusal, overall and balanced accuracy over the labelled examples."""
    answerable = [r for r in records if r.answerable is True]
    unanswerable = [r for r in records if r.answerable is False]
    answer_correct = [0.0 if r.refused else record_em(r) for r in answerable]
    refusal_correct = [1.0 if r.refused else 0.0 for r in unanswerable]
    answerable_accuracy = _mean(answer_correct)
    refusal_accuracy = _mean(refusal_correct)
    balanced = (
        (answerable_accuracy + refusal_accuracy) / 2
        if answerable_accuracy is not None and refusal_accuracy is not None
        else None
    )
    return {
        "answerable_em": exact_match_rate(answerable),
        "answerable_f1": f1_mean(answerable),
        "answerable_accuracy": answerable_accuracy,
        "refusal_accuracy": refusal_accuracy,
        "overall_accuracy": _mean(answer_correct + refusal_correct),
        "balanced_accuracy": balanced,
    }


def reader_metrics(records: Sequence[EvalRecord]) -> dict[str, float | None]:
    """EM / F1 of the separate reader's answers (the records the reader answered)."""
    read = [r for r in records if r.reader_prediction is not None]
    return {
        "reader_em": _mean(exact_match(r.reader_prediction, r.golden_answers) for r in read),
        "reader_f1": _mean(f1_score(r.reader_prediction, r.golden_answers) for r in read),
    }


def judged_grace_metrics(records: Sequence[EvalRecord]) -> dict[str, float | None]:
    """GRACE's paper measures: BERTScore F1 (answerable) and the LLM judge's accuracies."""
    answerable = [r for r in records if r.answerable is True]
    judged = [r for r in records if r.answerable is not None and r.judge_correct is not None]
    on_answerable = _mean(float(r.judge_correct) for r in judged if r.answerable)
    on_unanswerable = _mean(float(r.judge_correct) for r in judged if not r.answerable)
    balanced = (
        (on_answerable + on_unanswerable) / 2 if on_answerable is not None and on_unanswerable is not None else None
    )
    return {
        "bertscore_f1": _mean(r.bertscore_f1 for r in answerable if r.bertscore_f1 is not None),
        "judge_answerable": on_answerable,
        "judge_unanswerable": on_unanswerable,
        "judge_accuracy": _mean(float(r.judge_correct) for r in judged),
        "judge_balanced_accuracy": balanced,
    }


def summarize(records: Sequence[EvalRecord]) -> dict[str, float | None]:
    """Every metric of :data:`METRIC_NAMES` (plus answerable accuracy) over ``records``."""
    out: dict[str, float | None] = {
        "n": len(records),
        "em": exact_match_rate(records),
        "f1": f1_mean(records),
        "answer_recall": answer_recall_rate(records),
        "compression_ratio": compression_ratio(records),
        "avg_searches": average_searches(records),
        "note_rate": note_rate(records),
        "mean_eqr": mean_eqr(records),
        "mean_context_tokens": mean_context_tokens(records),
    }
    out.update(grace_metrics(records))
    out.update(reader_metrics(records))
    out.update(judged_grace_metrics(records))
    return out


def group_by(records: Iterable[EvalRecord], key: Callable[[EvalRecord], str | None]) -> dict[str, list[EvalRecord]]:
    groups: dict[str, list[EvalRecord]] = defaultdict(list)
    for r in records:
        groups[str(key(r))].append(r)
    return dict(sorted(groups.items()))


def metrics_by_source(records: Sequence[EvalRecord]) -> dict[str, dict[str, float | None]]:
    """``{data_source: summarize(...), ..., "all": summarize(all)}``."""
    out = {source: summarize(group) for source, group in group_by(records, lambda r: r.data_source).items()}
    out[ALL_SOURCES] = summarize(records)
    return out


def reward_means(records: Sequence[EvalRecord]) -> dict[str, dict[str, float]]:
    """Mean of every reward component, ``{manager: {component: mean}}`` over the records that have it."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        for manager, components in r.rewards.items():
            for name, value in components.items():
                if value is not None:
                    values[manager][name].append(float(value))
    return {m: {c: fmean(v) for c, v in comps.items()} for m, comps in sorted(values.items())}
