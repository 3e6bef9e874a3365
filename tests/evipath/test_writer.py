"""The parquet files are read by verl 0.9's own SFT dataset class with a real (tiny) tokenizer."""

from __future__ import annotations

import asyncio

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

from verl_evidence.evipath.pipeline import Synthesizer, Trajectory
from verl_evidence.evipath.teacher import Teacher, TeacherConfig
from verl_evidence.evipath.writer import planner_messages, write_outputs
from verl_evidence.local.tiny_models import tiny_tokenizer
from verl_evidence.prompts import load_prompt


@pytest.fixture(scope="module")
def kept(chat_server, selector, scripted, hotpot_records):
    chat_server.reset(scripted())

    async def go():
        teacher = Teacher(TeacherConfig(model="scripted", base_url=chat_server.base_url, api_key="t"))
        try:
            return await Synthesizer(teacher, selector).synthesize(hotpot_records)
        finally:
            await teacher.close()

    return asyncio.run(go())


def _dataset(path, **overrides):
    config = OmegaConf.create({"max_length": 4096, "truncation": "error", "pad_mode": "right", **overrides})
    return MultiTurnSFTDataset(str(path), tiny_tokenizer(), config)


@pytest.mark.parametrize("planner_format", ["paper", "search"])
def test_verl_sft_dataset_reads_the_parquet(kept, tmp_path, planner_format):
    outputs = write_outputs(kept, tmp_path, planner_format=planner_format)
    tok = tiny_tokenizer()
    for name, rows in (("planner", 2), ("executor", 6), ("train", 8)):
        table = pq.read_table(outputs[name])
        assert table.num_rows == rows
        assert set(table.column("kind").to_pylist()) <= {"planner", "executor"}
        dataset = _dataset(outputs[name])
        assert len(dataset) == rows
        for i in range(rows):
            item = dataset[i]
            ids, loss = item["input_ids"], item["loss_mask"]
            assert ids.shape == loss.shape == item["attention_mask"].shape == (4096,)
            trained = tok.decode(ids[loss.bool()])
            messages = table.column("messages")[i].as_py()
            # Exactly the assistant turns are trained on, nothing from the prompts or observations.
            for m in messages:
                if m["role"] == "assistant":
                    assert m["content"] in trained
                else:
                    assert m["content"] not in trained
            assert int(loss.sum()) > 0


def test_planner_dialogue_layouts(kept):
    collegian = next(r for r in kept if isinstance(r, Trajectory) and r.record.id == "collegian")
    paper = planner_messages(collegian, "paper")
    assert [m["role"] for m in paper] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert paper[0]["content"] == load_prompt("evipath_planner").strip()
    assert paper[1]["content"] == "Question: When was the institute that owns The Collegian founded?"
    assert 'Search("Which institute owns The Collegian?")' in paper[2]["content"]
    assert paper[5]["content"] == "Observation:\nHouston Baptist University was founded in 1960."
    assert paper[-1]["content"].endswith("<answer> 1960 </answer>")
    # Nothing the planner could not know leaks into its prompt.
    assert "1960" not in paper[0]["content"] + paper[1]["content"]

    search = planner_messages(collegian, "search")
    assert [m["role"] for m in search] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert search[0]["content"].endswith("Question: When was the institute that owns The Collegian founded?")
    assert search[1]["content"].endswith("<search> Which institute owns The Collegian? </search>")
    assert search[4]["content"] == "<information> Houston Baptist University was founded in 1960. </information>"

    directors = next(r for r in kept if isinstance(r, Trajectory) and r.record.id == "directors")
    search = planner_messages(directors, "search")
    # Two searches in one planner step become two loop turns; only the first carries the thought.
    assistants = [m["content"] for m in search if m["role"] == "assistant"]
    assert (
        assistants[0].startswith("<think>")
        and assistants[1] == "<search> Who directed When Father Was Away on Business? </search>"
    )
    with pytest.raises(ValueError, match="unknown planner format"):
        planner_messages(directors, "xml")


def test_executor_rows_hold_the_shuffled_pool(kept, tmp_path):
    outputs = write_outputs(kept, tmp_path)
    rows = pq.read_table(outputs["executor"]).to_pylist()
    first = rows[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    assert first[0]["content"] == load_prompt("evipath_executor").strip()
    assert "Golden evidence" not in first[1]["content"] and "Answer:" not in first[1]["content"]
    assert "<select>[" in first[2]["content"] and first[2]["content"].rstrip().endswith("</answer>")
    assert all(r["data_source"] == "evipath_hotpotqa" for r in rows)


def test_validation_split_keeps_a_question_on_one_side(kept, tmp_path):
    outputs = write_outputs(kept, tmp_path, val_fraction=0.5)
    train = pq.read_table(outputs["train"]).to_pylist()
    val = pq.read_table(outputs["val"]).to_pylist()
    assert len(train) + len(val) == 8 and train and val
    assert not {r["id"] for r in train} & {r["id"] for r in val}
    assert {r["kind"] for r in val} == {"planner", "executor"}
    assert "val" not in write_outputs(kept, tmp_path / "no_val")
    with pytest.raises(ValueError, match="val_fraction"):
        write_outputs(kept, tmp_path / "bad", val_fraction=1.0)
