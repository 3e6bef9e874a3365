"""Kept trajectories → chat-format parquet for verl's SFT trainer.

verl 0.9's ``MultiTurnSFTDataset`` (``verl.trainer.sft_trainer``) reads the
column named by ``data.messages_key`` (default ``messages``): a list of
``{"role", "content"}`` dicts, trained on every assistant message. Two kinds of
rows are written:

- planner: multi-turn dialogue (question → think/action turns with observations
  as user turns → final answer);
- executor: single turn (sub-question + shuffled numbered pool → think/select/answer).

Planner layouts:

- ``paper``: system prompt ``evipath_planner``, actions as ``<action> Search("…") </action>``,
  observations as ``Observation:`` user turns (the paper's agent).
- ``search``: the ``evidence_search`` agent loop's protocol, so the fine-tuned planner
  can be evaluated in that loop: the prompt ``evipath_planner_search`` as the user turn,
  one ``<search> … </search>`` per assistant turn, observations as
  ``<information> … </information>`` user turns.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from verl_evidence.agent_loops.protocol import (
    PAPER_QUESTION_PROMPT,
    PLANNER_LAYOUTS,
    executor_user,
    information_text,
    observation_text,
    user_prompt,
)
from verl_evidence.evipath.parsing import render_executor_step
from verl_evidence.evipath.pipeline import Rejection, Trajectory
from verl_evidence.prompts import load_prompt

logger = logging.getLogger(__name__)

PLANNER_FORMATS = PLANNER_LAYOUTS

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SCHEMA = pa.schema(
    [
        ("messages", pa.list_(_MESSAGE)),
        ("kind", pa.string()),
        ("id", pa.string()),
        ("data_source", pa.string()),
        ("question", pa.string()),
        ("answers", pa.list_(pa.string())),
    ]
)


def planner_messages(trajectory: Trajectory, fmt: str = "paper", prompt: str | None = None) -> list[dict[str, str]]:
    record = trajectory.record
    if fmt == "paper":
        messages = [
            {"role": "system", "content": load_prompt(prompt or "evipath_planner").strip()},
            {"role": "user", "content": user_prompt(PAPER_QUESTION_PROMPT, record.question)},
        ]
        for i, turn in enumerate(trajectory.turns):
            messages.append({"role": "assistant", "content": turn["text"]})
            if i < len(trajectory.subquestions):
                observations = [s.observation for s in trajectory.subquestions[i]]
                messages.append({"role": "user", "content": observation_text(observations)})
        return messages
    if fmt == "kg":
        # the KG form's dialogue as synthesised: the question with its candidates, then the observations
        users = getattr(trajectory, "planner_users", None)
        if users is None:
            raise ValueError("the kg planner layout needs a trajectory of the KG form (--planner-form kg)")
        messages = [{"role": "system", "content": load_prompt(prompt or "evipath_planner_kg").strip()}]
        for user, turn in zip(users, trajectory.turns):
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": turn["text"]}]
        return messages
    if fmt == "search":
        messages = [{"role": "user", "content": user_prompt(prompt or "evipath_planner_search", record.question)}]
        for i, turn in enumerate(trajectory.turns):
            thought = f"<think>\n{turn['think']}\n</think>\n"
            if turn["answer"] is not None:
                messages.append({"role": "assistant", "content": f"{thought}<answer> {turn['answer']} </answer>"})
                continue
            # The loop takes one search per generation: a multi-search step becomes consecutive turns.
            for j, sub in enumerate(trajectory.subquestions[i]):
                head = thought if j == 0 else ""
                messages.append({"role": "assistant", "content": f"{head}<search> {sub.question} </search>"})
                messages.append({"role": "user", "content": information_text(sub.observation)})
        return messages
    raise ValueError(f"unknown planner format {fmt!r}; choose one of {', '.join(PLANNER_FORMATS)}, kg")


def executor_examples(trajectory: Trajectory, prompt: str | None = None) -> list[list[dict[str, str]]]:
    system = load_prompt(prompt or "evipath_executor").strip()
    out = []
    for step in trajectory.subquestions:
        for sub in step:
            out.append(
                [
                    {"role": "system", "content": system},
                    {"role": "user", "content": executor_user(sub.question, sub.pool)},
                    {"role": "assistant", "content": render_executor_step(sub.step)},
                ]
            )
    return out


def _row(trajectory: Trajectory, kind: str, messages: list[dict[str, str]]) -> dict:
    record = trajectory.record
    return {
        "messages": messages,
        "kind": kind,
        "id": record.id,
        "data_source": f"evipath_{record.source}",
        "question": record.question,
        "answers": list(record.answers),
    }


def write_parquet(rows: Sequence[dict], path: Path) -> Path:
    table = pa.Table.from_pylist(list(rows), schema=SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def write_outputs(
    results: Iterable[Trajectory | Rejection],
    out_dir: str | Path,
    planner_format: str = "paper",
    planner_prompt: str | None = None,
    executor_prompt: str | None = None,
    seed: int = 0,
    val_fraction: float = 0.0,
) -> dict[str, Path]:
    """planner.parquet, executor.parquet, train.parquet (both, shuffled), trajectories.jsonl, rejections.jsonl.

    With ``val_fraction > 0`` a share of the kept trajectories (whole trajectories, so a
    question's planner and executor rows stay on one side) goes to val.parquet instead of
    train.parquet; planner/executor.parquet always hold everything.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    planner_rows, executor_rows = [], []
    by_record: dict[str, list[dict]] = {}
    with (
        (out_dir / "trajectories.jsonl").open("w", encoding="utf-8") as kept,
        (out_dir / "rejections.jsonl").open("w", encoding="utf-8") as rejected,
    ):
        for result in results:
            if isinstance(result, Rejection):
                rejected.write(
                    json.dumps({"id": result.record.id, "reason": result.reason, "detail": result.detail}) + "\n"
                )
                continue
            planner_row = _row(result, "planner", planner_messages(result, planner_format, planner_prompt))
            executor_part = [_row(result, "executor", m) for m in executor_examples(result, executor_prompt)]
            planner_rows.append(planner_row)
            executor_rows.extend(executor_part)
            by_record.setdefault(result.record.id, []).extend([planner_row, *executor_part])
            kept.write(json.dumps(_trajectory_json(result), ensure_ascii=False) + "\n")
    rng = random.Random(seed)
    record_ids = sorted(by_record)
    rng.shuffle(record_ids)
    n_val = int(round(len(record_ids) * val_fraction))
    val_rows = [row for rid in record_ids[:n_val] for row in by_record[rid]]
    train_rows = [row for rid in record_ids[n_val:] for row in by_record[rid]]
    rng.shuffle(train_rows)
    outputs = {
        "planner": write_parquet(planner_rows, out_dir / "planner.parquet"),
        "executor": write_parquet(executor_rows, out_dir / "executor.parquet"),
        "train": write_parquet(train_rows, out_dir / "train.parquet"),
        "trajectories": out_dir / "trajectories.jsonl",
        "rejections": out_dir / "rejections.jsonl",
    }
    if val_fraction > 0:
        outputs["val"] = write_parquet(val_rows, out_dir / "val.parquet")
    return outputs


def _trajectory_json(trajectory: Trajectory) -> dict:
    return {
        "id": trajectory.record.id,
        "question": trajectory.record.question,
        "answers": list(trajectory.record.answers),
        "final_answer": trajectory.final_answer,
        "em": trajectory.em,
        "f1": trajectory.f1,
        "turns": trajectory.turns,
        **({"planner_users": trajectory.planner_users} if getattr(trajectory, "planner_users", None) else {}),
        "subquestions": [
            [
                {
                    "question": s.question,
                    "answer_sentence": s.answer_sentence,
                    "golden": s.golden,
                    "golden_scores": s.golden_scores,
                    "fallback": s.fallback,
                    "golden_positions": s.golden_positions,
                    "step": asdict(s.step),
                }
                for s in step
            ]
            for step in trajectory.subquestions
        ],
    }
