"""Parquet files laid out exactly as Search-R1's merge scripts write them, built with pyarrow from a few rows.

Source: PeterGriffinJin/Search-R1, ``scripts/data_process/qa_search_train_merge.py`` (train) and
``qa_search_test_merge.py`` (test). For each name in ``--data_sources`` they load
``RUC-NLPIR/FlashRAG_datasets`` (train: the ``train`` split; test: ``test``, else ``dev``, else
``train``), map every example with its index *within that dataset* and save the concatenation with
HF ``datasets.Dataset.to_parquet``. ``map`` keeps the input columns and appends the returned ones, so a
file has, in this order:

=================  ==========================================  ===============================================
column             arrow type                                  value
=================  ==========================================  ===============================================
``id``             string                                      FlashRAG's id, restarting per dataset and named
                                                               after the FlashRAG split: ``train_0``, ``dev_0``
``question``       string                                      FlashRAG's question, stripped, ``?`` appended
                                                               when missing (the map edits it in place)
``golden_answers`` list<string>                                FlashRAG's answers
``metadata``       struct (varies by dataset), null elsewhere  FlashRAG's annotations, only when a merged
                                                               dataset has them (HotpotQA: type, level,
                                                               supporting_facts, context); concatenation
                                                               fills other datasets' rows with null
``data_source``    string                                      the FlashRAG config name: ``nq``, ``hotpotqa``…
``prompt``         list<struct<role: string, content: string>>  one user message: the instruction, then
                                                               ``Question: <question>\\n``
``ability``        string                                      ``fact-reasoning``
``reward_model``   struct<style: string,                       ``{"style": "rule", "ground_truth":
                   ground_truth: struct<target: list<string>>>  {"target": golden_answers}}``
``extra_info``     struct<split: string, index: int64>         ``split`` is ``train`` / ``test`` (the test
                                                               script writes ``test`` even for dev splits);
                                                               ``index`` restarts per dataset
=================  ==========================================  ===============================================

``to_parquet`` writes row groups of 1000 rows (datasets' default writer batch). The instruction's
wording is Search-R1's and is not reproduced here: ``INSTRUCTION`` stands in for it (no reader looks at
it); only its place in the message is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# Stand-in for Search-R1's instruction text (see the module docstring).
INSTRUCTION = "[Search-R1 instruction: think, <search> query </search>, <answer> answer </answer>.] "
# FlashRAG split each test-merge dataset comes from (``test`` where the dataset has one, else ``dev``).
TEST_MERGE_SPLITS = {
    "nq": "test",
    "triviaqa": "test",
    "popqa": "test",
    "hotpotqa": "dev",
    "2wikimultihopqa": "dev",
    "musique": "dev",
    "bamboogle": "test",
}
HOTPOTQA_METADATA = pa.struct(
    [
        pa.field("type", pa.string()),
        pa.field("level", pa.string()),
        pa.field(
            "supporting_facts",
            pa.struct([pa.field("title", pa.list_(pa.string())), pa.field("sent_id", pa.list_(pa.int64()))]),
        ),
        pa.field(
            "context",
            pa.struct(
                [pa.field("title", pa.list_(pa.string())), pa.field("sentences", pa.list_(pa.list_(pa.string())))]
            ),
        ),
    ]
)


def search_r1_schema(metadata: pa.DataType | None) -> pa.Schema:
    """The file's schema; ``metadata`` is the merged datasets' metadata type (None: no such column)."""
    fields = [
        pa.field("id", pa.string()),
        pa.field("question", pa.string()),
        pa.field("golden_answers", pa.list_(pa.string())),
    ]
    if metadata is not None:
        fields.append(pa.field("metadata", metadata))
    return pa.schema(
        fields
        + [
            pa.field("data_source", pa.string()),
            pa.field("prompt", pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())]))),
            pa.field("ability", pa.string()),
            pa.field(
                "reward_model",
                pa.struct(
                    [
                        pa.field("style", pa.string()),
                        pa.field("ground_truth", pa.struct([pa.field("target", pa.list_(pa.string()))])),
                    ]
                ),
            ),
            pa.field("extra_info", pa.struct([pa.field("split", pa.string()), pa.field("index", pa.int64())])),
        ]
    )


def search_r1_row(example: Mapping, data_source: str, split: str, index: int) -> dict:
    """One FlashRAG example as the merge scripts' map turns it into a row (field by field)."""
    question = str(example["question"]).strip()
    if not question.endswith("?"):
        question += "?"
    return {
        "id": example["id"],
        "question": question,
        "golden_answers": list(example["golden_answers"]),
        "metadata": example.get("metadata"),
        "data_source": data_source,
        "prompt": [{"role": "user", "content": f"{INSTRUCTION}Question: {question}\n"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": list(example["golden_answers"])}},
        "extra_info": {"split": split, "index": index},
    }


def flashrag_examples(data_source: str, flashrag_split: str, count: int, with_metadata: bool = False) -> list[dict]:
    """``count`` FlashRAG-style examples with FlashRAG's per-dataset ids (``<split>_<n>``)."""
    examples = []
    for n in range(count):
        example = {
            "id": f"{flashrag_split}_{n}",
            # Some FlashRAG questions lack the final '?' (NQ's are lower-case, unpunctuated).
            "question": f"  {data_source} question number {n}" + ("?" if n % 2 else ""),
            "golden_answers": [f"{data_source} answer {n}", f"alias {n}"],
        }
        if with_metadata:
            example["metadata"] = {
                "type": "bridge",
                "level": "hard",
                "supporting_facts": {"title": [f"Title {n}", f"Other {n}"], "sent_id": [0, 1]},
                "context": {
                    "title": [f"Title {n}", f"Other {n}"],
                    "sentences": [[f"Sentence {n}.0.", f"Sentence {n}.1."], [f"Other {n}.0.", f"Other {n}.1."]],
                },
            }
        examples.append(example)
    return examples


def write_search_r1_parquet(
    path: Path, datasets: Mapping[str, Sequence[Mapping]], split: str, metadata: pa.DataType | None = None
) -> Path:
    """``datasets`` maps data_source -> FlashRAG examples, merged in that order as the scripts merge them."""
    rows = [
        search_r1_row(example, data_source, split, index)
        for data_source, examples in datasets.items()
        for index, example in enumerate(examples)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=search_r1_schema(metadata)), path, row_group_size=1000)
    return path


def merged_train_file(path: Path, nq: int = 3, hotpotqa: int = 3) -> Path:
    """``qa_search_train_merge.py --data_sources nq,hotpotqa``."""
    datasets = {
        "nq": flashrag_examples("nq", "train", nq),
        "hotpotqa": flashrag_examples("hotpotqa", "train", hotpotqa, with_metadata=True),
    }
    return write_search_r1_parquet(path, datasets, "train", HOTPOTQA_METADATA)


def merged_test_file(path: Path, per_dataset: int = 2) -> Path:
    """``qa_search_test_merge.py --data_sources nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle``."""
    datasets = {
        name: flashrag_examples(name, flashrag_split, per_dataset, with_metadata=name == "hotpotqa")
        for name, flashrag_split in TEST_MERGE_SPLITS.items()
    }
    return write_search_r1_parquet(path, datasets, "test", HOTPOTQA_METADATA)
