"""Recorded trajectories as a policy: their texts are replayed, the rest runs live.

A trajectory names a question and the policy's texts; the evaluation builds
the question's verl row (bundled set, or ``--data`` rows), runs the row's agent
loop with a scripted backend that emits the recorded texts, so retrieval,
masking, token accounting and scoring are real. One JSON object per line::

    {"id": "search-q001-well_grounded", "question_id": "q001", "rollout": "search",
     "case": "well_grounded",
     "turns": ["<think>..</think><search>..</search>", "<summary>..</summary><answer>..</answer>"]}
    {"id": ..., "question_id": "q001", "rollout": "eviomni", "case": ...,
     "response": "<reason>..</reason><extract>..</extract><answer>..</answer>",
     "answer_r": "<answer>..</answer>", "answer_e": "<answer>..</answer>"}
    {"id": ..., "question_id": "q001", "rollout": "grace", "case": ..., "answerable": true,
     "passage_ids": ["p0001", "p0107", "p0033"], "response": "<evidence>..</evidence><answer>..</answer>"}

``rollout`` may also be given as ``method`` (evinote / search_r1 -> search,
lear -> eviomni); ``turns`` and ``response`` are interchangeable for
single-turn rollouts. GRACE trajectories without ``passage_ids`` use the
constructed context of that question with the same ``answerable`` label.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_evidence.eval.runner import EvalExample, rollout_kind

logger = logging.getLogger(__name__)

__all__ = ["Trajectory", "load_trajectories", "replay_examples", "trajectory_script"]

_ROLLOUT_ALIASES = {
    "search": "search",
    "evinote": "search",
    "search_r1": "search",
    "evidence_search": "search",
    "eviomni": "eviomni",
    "lear": "eviomni",
    "grace": "grace",
}

Trajectory = dict[str, Any]


def _rollout_of(traj: Trajectory, where: str) -> str:
    name = traj.get("rollout") or traj.get("method") or traj.get("agent_name")
    if name not in _ROLLOUT_ALIASES:
        raise ValueError(f"{where}: unknown rollout {name!r}; use one of {sorted(set(_ROLLOUT_ALIASES))}")
    return _ROLLOUT_ALIASES[name]


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Read and check a trajectories JSONL file; every problem names the line."""
    path = Path(path)
    out: list[Trajectory] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                traj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg})") from err
            if not isinstance(traj, dict):
                raise ValueError(f"{where}: expected a JSON object")
            traj = dict(traj)
            traj["rollout"] = _rollout_of(traj, where)
            if not (traj.get("question_id") or traj.get("qid")):
                raise ValueError(f"{where}: missing question_id")
            traj["question_id"] = str(traj.get("question_id") or traj.get("qid"))
            traj.setdefault("id", f"{traj['rollout']}-{traj['question_id']}-{lineno}")
            trajectory_script(traj, where)  # fail now, not mid-run
            out.append(traj)
    ids = [t["id"] for t in out]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{path}: duplicate trajectory ids {duplicates[:5]}")
    return out


def _texts(traj: Trajectory) -> list[str]:
    turns = traj.get("turns")
    if turns is None:
        turns = [traj["response"]] if isinstance(traj.get("response"), str) else None
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        return []
    return list(turns)


def trajectory_script(traj: Trajectory, where: str = "trajectory") -> list[str]:
    """The texts the scripted backend emits, in the order the rollout asks for them."""
    texts = _texts(traj)
    if not texts:
        raise ValueError(f"{where}: needs 'turns' (list of strings) or 'response' (string)")
    if traj["rollout"] != "eviomni":
        return texts
    full = "".join(texts)
    cut = full.find("</extract>")
    first, rest = (full[: cut + len("</extract>")], full[cut + len("</extract>") :]) if cut >= 0 else (full, "")
    answer_r = traj.get("answer_r", traj.get("eviomni_answer_r", rest))
    answer_e = traj.get("answer_e", traj.get("eviomni_answer_e", rest))
    return [first, rest, str(answer_r), str(answer_e)]


def _row_key(row: dict[str, Any]) -> tuple[str, str]:
    return rollout_kind(row), str((row.get("extra_info") or {}).get("id"))


def replay_examples(
    trajectories: Sequence[Trajectory],
    session: Any,
    rollouts: Sequence[str] | None = None,
    limit: int | None = None,
    data: Sequence[Path] | None = None,
    qa_path: str | Path | None = None,
    corpus_path: str | Path | None = None,
) -> list[EvalExample]:
    """Pair each trajectory with its question's verl row; ``limit`` keeps the first N per (rollout, case).

    Rows come from ``data`` files when given, else are built from the QA set
    (``qa_path``/``corpus_path``, default the bundled ones).
    """
    from verl_evidence.eval.datasets import bundled_rows, load_rows

    chosen = [t for t in trajectories if rollouts is None or t["rollout"] in rollouts]
    if limit:
        kept: list[Trajectory] = []
        per_group: dict[tuple[str, str], int] = {}
        for t in chosen:
            key = (t["rollout"], str(t.get("case")))
            if per_group.get(key, 0) < limit:
                per_group[key] = per_group.get(key, 0) + 1
                kept.append(t)
        chosen = kept
    if not chosen:
        return []
    needed = sorted({t["rollout"] for t in chosen})
    qids = sorted({t["question_id"] for t in chosen})
    if data:
        rows = [row for path in data for row in load_rows(path)]
    else:
        # GRACE rows with an explicit context are built below; only the others need construction.
        constructed = [
            r for r in needed if r != "grace" or any("passage_ids" not in t for t in chosen if t["rollout"] == "grace")
        ]
        rows = (
            bundled_rows(
                constructed,
                session.retrieval_url,
                session.tokenizer,
                question_ids=qids,
                qa_path=qa_path,
                corpus_path=corpus_path,
            )
            if constructed
            else []
        )
    by_key: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        by_key.setdefault(_row_key(row), []).append(row)

    examples = []
    for t in chosen:
        if t["rollout"] == "grace" and "passage_ids" in t and not data:
            row = _grace_row(t, qa_path, corpus_path)
        else:
            candidates = by_key.get((t["rollout"], t["question_id"]), [])
            if t["rollout"] == "grace" and "answerable" in t:
                candidates = [
                    r
                    for r in candidates
                    if bool((r.get("extra_info") or {}).get("answerable")) == bool(t["answerable"])
                ]
            if not candidates:
                raise ValueError(
                    f"trajectory {t['id']}: no {t['rollout']} row for question {t['question_id']!r}"
                    + (f" with answerable={t['answerable']}" if "answerable" in t else "")
                )
            row = candidates[0]
        examples.append(
            EvalExample(
                example_id=f"{t['rollout']}/{t['id']}",
                row=row,
                script=trajectory_script(t),
                case=str(t["case"]) if t.get("case") is not None else None,
            )
        )
    return examples


def _grace_row(traj: Trajectory, qa_path: str | Path | None, corpus_path: str | Path | None) -> dict[str, Any]:
    """The GRACE row of a trajectory that names its own context passages."""
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.grace import GraceExample
    from verl_evidence.dataprep.templates import load_template
    from verl_evidence.eval.datasets import SPLIT, bundled_qa_records

    records, corpus = bundled_qa_records(qa_path, corpus_path)
    record = next((r for r in records if r.id == traj["question_id"]), None)
    if record is None:
        raise ValueError(f"trajectory {traj['id']}: question {traj['question_id']!r} is not in the bundled QA set")
    missing = [p for p in traj["passage_ids"] if p not in corpus]
    if missing:
        raise ValueError(f"trajectory {traj['id']}: passage ids {missing} are not in the bundled corpus")
    gold = set(record.gold_passage_ids)
    answerable = bool(traj["answerable"]) if "answerable" in traj else gold <= set(traj["passage_ids"])
    example = GraceExample(
        record=record,
        retriever="reference",
        passage_ids=tuple(traj["passage_ids"]),
        answerable=answerable,
        evidence_sentences=True,  # an annotated QA file's gold evidence: one evidence's supporting sentences
    )
    return rows_mod.grace_rows([example], corpus, load_template("grace"), SPLIT)[0]
