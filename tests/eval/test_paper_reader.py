"""EviOmni's QA generator: its SFT rows ((q, P) -> a) and its LoRA checkpoint as ``eval --reader``."""

from __future__ import annotations

import pytest

from verl_evidence.eval.paper_reader_data import bundled_source_rows, main, reader_rows
from verl_evidence.eval.paper_scoring import PaperScoringError, apply_lora_adapter, reader_model_dir
from verl_evidence.prompts import load_prompt, render_prompt


@pytest.fixture(scope="module")
def source_rows():
    return bundled_source_rows()[:4]


def test_reader_rows_ask_the_papers_reader_prompt_and_answer_the_gold(source_rows) -> None:
    from verl_evidence.dataprep.templates import format_passages

    rows = reader_rows(source_rows)
    first, source = rows[0], source_rows[0]
    question = source["extra_info"]["question"]
    passages = [p["contents"] for p in source["extra_info"]["passages"]]
    assert len(passages) == 5
    user, assistant = first["messages"]
    assert user == {
        "role": "user",
        "content": render_prompt(
            load_prompt("eviomni_reader").strip(), question=question, document=format_passages(passages)
        ),
    }
    assert assistant == {"role": "assistant", "content": source["reward_model"]["ground_truth"]["target"][0]}
    zero = reader_rows(source_rows, "eviomni_closed_book")[0]["messages"][0]["content"]
    assert question in zero and passages[0][:30] not in zero  # the Zero baseline's reader sees the question only


def test_rows_it_cannot_train_on_fail_naming_the_row(source_rows, tmp_path) -> None:
    broken = dict(source_rows[0], reward_model={"ground_truth": {"target": []}})
    with pytest.raises(ValueError, match="row 0 .*no gold answer"):
        reader_rows([broken])
    no_passages = dict(source_rows[0], extra_info={**source_rows[0]["extra_info"], "passages": []})
    with pytest.raises(ValueError, match="no passages"):
        reader_rows([no_passages])
    assert reader_rows([no_passages], "eviomni_closed_book")  # the closed-book reader needs none
    assert main(["--rows", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "x.parquet")]) == 2


def test_a_lora_checkpoint_answers_with_its_adapter_merged(tmp_path) -> None:
    """verl's merger writes the base weights and lora_adapter/ beside them; the reader must use both."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from verl_evidence.local.tiny_models import tiny_causal_lm

    merged = tmp_path / "global_step_4-abc"
    base = tiny_causal_lm(seed=5, directory=merged)
    torch.manual_seed(0)
    peft_model = get_peft_model(
        base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    )
    peft_model.save_pretrained(merged / "lora_adapter")  # adapter_config.json + adapter_model.safetensors
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        tuned = peft_model(ids).logits
        untouched = AutoModelForCausalLM.from_pretrained(merged)(ids).logits

    reader_dir = reader_model_dir(merged)
    assert reader_dir == merged / "with_lora" and (reader_dir / "tokenizer_config.json").is_file()
    with torch.no_grad():
        read = AutoModelForCausalLM.from_pretrained(reader_dir)(ids).logits
    assert torch.allclose(read, tuned, atol=1e-5) and not torch.allclose(read, untouched, atol=1e-3)
    assert apply_lora_adapter(merged) == reader_dir  # merged once, then reused
    assert reader_model_dir(tmp_path / "plain") == tmp_path / "plain"  # not a directory: chat_model reports it
    (tmp_path / "not_a_checkpoint").mkdir()
    with pytest.raises(PaperScoringError, match="--reader .*not_a_checkpoint"):
        reader_model_dir(tmp_path / "not_a_checkpoint", cache_dir=tmp_path / "cache")
