"""Prompt sizes of every method's rows in Qwen tokens, measured on the bundled data with the real prompt files.

Each shape is rendered as data prep writes it (the same template, the same passage layout) and counted as verl's
overlong filter counts it: the policy family's chat template applied, generation prompt on. Passages are BM25's
top-k over the bundled corpus (in process, deterministic). docs/recipes.md shows the table this prints; a test
recomputes it, so the documented numbers cannot go stale:

    .venv/bin/python tests/tokenization/prompt_token_table.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The table's lines in docs/recipes.md sit between these two markers.
TABLE_START = "<!-- qwen-prompt-tokens:start -->"
TABLE_END = "<!-- qwen-prompt-tokens:end -->"


@dataclass(frozen=True)
class Shape:
    name: str  # what the row is
    recipes: str  # the recipes whose length setting it must fit
    family: str  # the vocabulary and chat template counted with (the recipes' default policy)
    counts: tuple[int, ...]

    @property
    def max(self) -> int:
        return max(self.counts)

    @property
    def p95(self) -> int:
        ordered = sorted(self.counts)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank


def _templated(family: str, prompts: list[list[dict]]) -> tuple[int, ...]:
    from verl_evidence.local.qwen_tokenizer import qwen_tokenizer

    tokenizer = qwen_tokenizer(family)
    return tuple(len(tokenizer.apply_chat_template(p, add_generation_prompt=True)["input_ids"]) for p in prompts)


def _plain(family: str, texts: list[str]) -> tuple[int, ...]:
    from verl_evidence.local.qwen_tokenizer import qwen_tokenizer

    return tuple(len(ids) for ids in qwen_tokenizer(family)(texts, add_special_tokens=False)["input_ids"])


def measure() -> list[Shape]:
    from verl_evidence.agent_loops.protocol import PAPER_QUESTION_PROMPT, executor_user, user_prompt
    from verl_evidence.dataprep import grace as grace_mod
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.retrievers import Query, build_retriever
    from verl_evidence.dataprep.templates import format_passages, load_template
    from verl_evidence.eval.datasets import bundled_qa_records
    from verl_evidence.prompts import load_prompt

    records, corpus = bundled_qa_records()
    bm25 = build_retriever("bm25", corpus)
    queries = [Query(id=r.id, question=r.question) for r in records]
    top5 = [[corpus[i] for i in ids] for ids in bm25.retrieve(queries, 5)]
    top3 = [passages[:3] for passages in top5]

    def prompts_of(rows: list[dict]) -> list[list[dict]]:
        return [row["prompt"] for row in rows]

    search_r1 = rows_mod.search_rows(records, "search_r1", load_template("search_r1"), "train")
    evinote = rows_mod.search_rows(records, "evinote", load_template("evinote"), "train")
    docs = [[{"id": str(n), "contents": text} for n, text in enumerate(passages)] for passages in top5]
    eviomni = rows_mod.eviomni_rows(records, docs, load_template("eviomni"), "train", len)
    items = [grace_mod.GraceInput(record=r) for r in records]
    examples, _ = grace_mod.construct(items, [build_retriever("oracle", corpus), bm25], corpus, k=5)
    grace = rows_mod.grace_rows(examples, corpus, load_template("grace"), "train")
    planner_system = load_prompt("evipath_planner").strip()
    executor_system = load_prompt("evipath_executor").strip()
    planner = [
        [
            {"role": "system", "content": planner_system},
            {"role": "user", "content": user_prompt(PAPER_QUESTION_PROMPT, r.question)},
        ]
        for r in records
    ]
    executor = [
        [{"role": "system", "content": executor_system}, {"role": "user", "content": executor_user(r.question, pool)}]
        for r, pool in zip(records, top5, strict=True)
    ]
    chat = "qwen2.5"
    return [
        Shape("Search-R1 prompt (question only)", "search_r1_baseline", chat, _templated(chat, prompts_of(search_r1))),
        Shape("EviNote prompt (question only)", "evinote_grpo", chat, _templated(chat, prompts_of(evinote))),
        Shape(
            "EviOmni/LEAR prompt, top-5 passages",
            "eviomni_grpo, lear_grpo",
            chat,
            _templated(chat, prompts_of(eviomni)),
        ),
        Shape("GRACE prompt, 5 passages", "grace_dapo", "qwen3", _templated("qwen3", prompts_of(grace))),
        Shape("EviPath planner prompt (system + question)", "evipath_sft", chat, _templated(chat, planner)),
        Shape("EviPath executor prompt, 5 passages", "evipath_sft", chat, _templated(chat, executor)),
        Shape(
            "one search result, top-3 passages (an observation)",
            "search_r1_baseline, evinote_grpo",
            chat,
            _plain(chat, [format_passages(passages) for passages in top3]),
        ),
    ]


def markdown_table(shapes: list[Shape]) -> str:
    lines = [
        TABLE_START,
        "| shape (bundled rows) | rows | max | p95 | counted with | must fit |",
        "|---|---:|---:|---:|---|---|",
    ]
    for shape in shapes:
        family = "Qwen2.5" if shape.family == "qwen2.5" else "Qwen3"
        lines.append(f"| {shape.name} | {len(shape.counts)} | {shape.max} | {shape.p95} | {family} | {shape.recipes} |")
    lines.append(TABLE_END)
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table(measure()))
