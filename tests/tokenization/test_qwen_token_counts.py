"""Where we count a Qwen policy's tokens without its own tokenizer on the machine: data prep's --tokenizer and the
pre-flight prompt-length check take Qwen's vocabulary built offline, and say so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from verl_evidence.local import qwen_tokenizer as builder

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "recipes"))

import preflight  # noqa: E402

NOT_HERE = "Qwen/Qwen2.5-7B-Instruct"  # no network, no hub cache of it in the suite's runs


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("qwen2.5", "qwen2.5"),
        ("qwen3", "qwen3"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5"),
        ("Qwen/Qwen2.5-Math-1.5B", "qwen2.5"),
        ("qwen2.5-7b", "qwen2.5"),
        ("Qwen/Qwen3-4B", "qwen3"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3"),
        ("Qwen/Qwen3.5-27B", None),  # another vocabulary (248k)
        ("Qwen/Qwen2-7B-Instruct", None),  # not the added tokens we build
        ("meta-llama/Llama-3.1-8B-Instruct", None),
    ],
)
def test_which_names_are_qwen_families(name, family):
    assert builder.qwen_family(name) == family


def test_a_qwen_model_on_this_machine_keeps_its_own_tokenizer(tmp_path: Path):
    local = tmp_path / "Qwen2.5-7B-Instruct"
    local.mkdir()
    assert builder.stand_in_family(str(local)) is None
    assert builder.stand_in_family(NOT_HERE) == "qwen2.5"
    assert builder.stand_in_family("qwen3") == "qwen3"


def test_data_prep_counts_a_qwen_policys_tokens_offline_and_says_so(capsys, qwen_tokenizer):
    from verl_evidence.dataprep.cli import token_counter

    count = token_counter(NOT_HERE)
    assert count("Hello world") == 2
    text = "<extract> The Nile </extract>The answer\n\n"
    assert count(text) == len(qwen_tokenizer.encode(text, add_special_tokens=False))
    said = " ".join(capsys.readouterr().err.split())
    assert "tokens counted with Qwen2.5's vocabulary built offline (qwen-tokenizer" in said
    assert f"{NOT_HERE}'s own tokenizer is not on this machine" in said


def _write_rows(path: Path, contents: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": content}],
            "ability": "fact-reasoning",
            "agent_name": "evidence_search",
            "reward_model": {"style": "rule", "ground_truth": {"target": ["Nile"], "evidence": ["x"]}},
            "extra_info": {"index": i, "question": "q", "method": "search_r1", "split": "train"},
        }
        for i, content in enumerate(contents)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_preflight_refuses_prompts_too_long_in_qwen_tokens(tmp_path: Path, capsys, qwen_tokenizer):
    """A Qwen policy not on the machine: its prompts are counted in Qwen's vocabulary (once skipped)."""
    contents = ["Answer the question. " + "The Nile flows north into the Mediterranean Sea. " * n for n in (30, 45)]
    rows = _write_rows(tmp_path / "long.parquet", contents)
    templated = [
        len(
            qwen_tokenizer.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True)[
                "input_ids"
            ]
        )
        for c in contents
    ]
    messages_only = min(len(qwen_tokenizer.encode(c, add_special_tokens=False)) for c in contents)
    limit = messages_only - 1
    args = [
        f"--config-path={REPO / 'recipes' / 'presets'}",
        "--config-name=evinote_grpo",
        f"data.train_files={rows}",
        "data.val_files=null",
        "reward_preset=evinote",
        "data.filter_overlong_prompts=true",
        f"actor_rollout_ref.model.path={NOT_HERE}",
        "+ray_kwargs.ray_init.num_gpus=8",
    ]
    found = preflight.check([*args, f"data.max_prompt_length={limit}"])
    assert found == [
        f"data.train_files: all 2 prompts of {rows} are longer than data.max_prompt_length={limit} tokens "
        f"(shortest {min(templated)}, longest {max(templated)}), so verl's overlong filter would leave no rows; "
        f"raise PROMPT_LEN (data.max_prompt_length) to at least {min(templated)}, or prepare the rows with fewer or "
        "shorter passages"
    ]
    said = " ".join(capsys.readouterr().err.split())
    assert "# pre-flight: prompt tokens counted with Qwen2.5's vocabulary built offline" in said
    assert preflight.check([*args, f"data.max_prompt_length={messages_only}"]) == []


def test_eval_takes_a_qwen_name_as_its_tokenizer(tmp_path: Path):
    from verl_evidence.eval.session import policy_tokenizer_dir

    directory, said = policy_tokenizer_dir(Path("Qwen/Qwen3-8B"))
    assert directory == builder.qwen_tokenizer_dir("qwen3")
    assert said.startswith("tokens counted with Qwen3's vocabulary built offline")
    assert policy_tokenizer_dir(tmp_path) == (tmp_path, None)
    # A path that is not there stays a path (its error is the loader's), whatever its name
    assert policy_tokenizer_dir(tmp_path / "qwen2.5-7b") == (tmp_path / "qwen2.5-7b", None)
    assert builder.qwen_family("./Qwen2.5-7B-Instruct") is None
