"""Smoke runs: a recipe through verl's own trainer on CPU, in about a minute.

``recipes/<name>.sh --smoke`` asks this module for three things and then runs
the recipe's ordinary verl command line in the CPU training mode
(:mod:`verl_evidence.cpu_mode`) with small batch, group and length settings:

1. a tiny policy (a 2-layer Qwen2 of hidden size 128 with the offline
   byte-level tokenizer) **warmed up** with verl's own SFT trainer on the
   methods' output formats, built from the bundled questions' gold answers
   and evidence. A random tiny policy scores 0 on every sample, so GRPO's
   advantages and gradients would all be 0 and the run would prove nothing;
   the warm-up makes it write the tags often enough for rewards to differ
   within a group;
2. the method's training data, prepared from the bundled set with the same
   ``verl-evidence data`` commands a user runs;
3. for EviNote, a small offline NLI judge whose entailment follows the note
   (:func:`verl_evidence.testing.overlap_nli_model`).

Everything is cached under ``~/.cache/verl-evidence/smoke`` (or
``$VERL_EVIDENCE_SMOKE_DIR``), keyed by this module's format version, so only
the first smoke run on a machine pays for the warm-up.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

# Bump when the policy, the warm-up data or the method data change shape: caches keyed by it are rebuilt.
FORMAT_VERSION = 1
POLICY_HIDDEN = 128
POLICY_LAYERS = 2
WARMUP_ROWS_PER_FORMAT = 8
WARMUP_EPOCHS = 30
WARMUP_BATCH = 4  # small batches: more updates per example seen
WARMUP_LR = 3e-3
SMOKE_TOPK = 2  # passages per EviOmni prompt: ~900 tokens with the byte-level tokenizer

METHODS = ("eviomni", "lear", "evinote", "search_r1", "grace", "composite", "evipath_sft")


def smoke_dir() -> Path:
    root = os.environ.get("VERL_EVIDENCE_SMOKE_DIR") or Path.home() / ".cache" / "verl-evidence" / "smoke"
    return Path(root) / f"v{FORMAT_VERSION}"


def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path.with_suffix(".lock"), "w")
    fcntl.flock(handle, fcntl.LOCK_EX)  # two recipes starting at once build the cache once
    return handle


# --------------------------------------------------------------------------- verl's console metrics

_METRIC = re.compile(r"([\w/@.-]+):(?:np\.\w+\()?(-?[0-9.]+(?:e[-+]?[0-9]+)?|nan|inf)\)?")


def step_metrics(output: str) -> dict[int, dict[str, float]]:
    """Every ``step:N - key:value - ...`` line of verl's console logger, as floats per step."""
    steps: dict[int, dict[str, float]] = {}
    for line in output.splitlines():
        found = line.find("step:")
        if found < 0 or " - " not in line[found:]:
            continue
        head, _, rest = line[found:].partition(" - ")
        try:
            step = int(head.split(":", 1)[1])
        except ValueError:
            continue
        steps[step] = {key: float(value) for key, value in _METRIC.findall(rest)}
    return steps


# --------------------------------------------------------------------------- data


def _cli(*args: str) -> None:
    """Run a ``verl-evidence`` command in-process (the same code path users run)."""
    from verl_evidence.cli import app

    app(list(args), standalone_mode=False)


def method_data(method: str, tokenizer_dir: Path) -> Path:
    """The training parquet of ``method``'s recipe, prepared from the bundled set (cached)."""
    kind = {"eviomni": "eviomni", "lear": "lear", "composite": "eviomni", "evinote": "evinote", "search_r1": "search_r1", "grace": "grace"}[method]
    out = smoke_dir() / "data" / f"{kind}.parquet"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.parquet")
    if kind in ("eviomni", "lear"):
        _cli("data", "eviomni", "bundled", "-o", str(tmp), "--method", kind, "--tokenizer", str(tokenizer_dir),
             "--retriever", "bm25", "--corpus", "bundled", "--topk", str(SMOKE_TOPK))
    elif kind in ("evinote", "search_r1"):
        _cli("data", "qa", "bundled", "-o", str(tmp), "--method", kind)
    else:
        _cli("data", "grace", "bundled", "-o", str(tmp), "--retriever", "bm25", "--k", str(SMOKE_TOPK))
    tmp.replace(out)
    return out


def _rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _first(values, default: str = "") -> str:
    values = list(values or [])
    return str(values[0]) if values else default


def _warmup_examples(rows: list[dict], target: Callable[[dict], list[dict] | None], count: int, seed: int) -> list[dict]:
    examples = []
    for row in random.Random(seed).sample(rows, len(rows)):
        reply = target(row)
        if reply:
            examples.append({"messages": list(row["prompt"]) + reply})
        if len(examples) == count:
            break
    return examples


def _eviomni_target(row: dict) -> list[dict] | None:
    truth = row["reward_model"]["ground_truth"]
    evidence, answer = _first(truth.get("evidence")), _first(truth.get("target"))
    if not evidence or not answer:
        return None
    rationale = f"The question asks: {row['extra_info']['question']} One passage states it."
    return [{"role": "assistant", "content": f"<reason>{rationale}</reason><extract>{evidence}</extract><answer>{answer}</answer>"}]


def _eviomni_masked_answers(rows: list[dict], count: int) -> list[dict]:
    """The o_r / o_e prompts (knowledge-masked inputs) the EviOmni loop asks the same policy to answer."""
    from verl_evidence.prompts import load_prompt, render_prompt
    from verl_evidence.tools.search_tool import format_documents

    template = load_prompt("eviomni_answer")
    examples = []
    for index, row in enumerate(rows[:count]):
        truth = row["reward_model"]["ground_truth"]
        evidence, answer = _first(truth.get("evidence")), _first(truth.get("target"))
        passages = format_documents([{"document": p} for p in row["extra_info"].get("passages") or []])
        masked = "[hidden]"
        fields = {"question": row["extra_info"]["question"], "passages": passages, "rationale": "One passage states it.", "evidence": evidence}
        fields["evidence" if index % 2 else "passages"] = masked
        if index % 2 == 0:
            fields["rationale"] = masked
        prompt = render_prompt(template, **fields)
        examples.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": f"<answer>{answer}</answer>"}]})
    return examples


def _search_target(with_note: bool) -> Callable[[dict], list[dict] | None]:
    from verl_evidence.bundled import load_corpus
    from verl_evidence.evipath.protocol import information_text
    from verl_evidence.tools.search_tool import format_documents

    corpus = {doc["id"]: doc["contents"] for doc in load_corpus()}

    def target(row: dict) -> list[dict] | None:
        truth = row["reward_model"]["ground_truth"]
        evidence, answer = _first(truth.get("evidence")), _first(truth.get("target"))
        question = row["extra_info"]["question"]
        passage = next((text for text in corpus.values() if evidence and evidence in text), None)
        if not answer or passage is None:
            return None
        # The search loop appends retrieved documents inside the assistant turn, as these tokens.
        observation = information_text(format_documents([{"document": {"id": "d", "contents": passage}}]))
        note = f"<summary>*{evidence}*</summary>\n" if with_note else ""
        text = f"<search>{question}</search>\n\n{observation}\n\n{note}<answer>{answer}</answer>"
        return [{"role": "assistant", "content": text}]

    return target


def _grace_target(row: dict) -> list[dict] | None:
    truth = row["reward_model"]["ground_truth"]
    answer = _first(truth.get("target"))
    if not answer:
        return None
    if truth.get("answerable"):
        evidence = _first(truth.get("evidence"))
        if not evidence:
            return None
        return [{"role": "assistant", "content": f"<evidence>{evidence}</evidence>\n<answer>{answer}</answer>"}]
    return [{"role": "assistant", "content": f"<llm>The context does not say; I recall it.</llm>\n<answer>{answer}</answer>"}]


def warmup_data(tokenizer_dir: Path) -> Path:
    """Chat-format parquet (``messages``) teaching every method's output format, for verl's SFT trainer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = smoke_dir() / "data" / "warmup.parquet"
    if out.exists():
        return out
    n = WARMUP_ROWS_PER_FORMAT
    eviomni_rows = _rows(method_data("eviomni", tokenizer_dir))
    examples = _warmup_examples(eviomni_rows, _eviomni_target, n, seed=1)
    examples += _eviomni_masked_answers(eviomni_rows, n)
    examples += _warmup_examples(_rows(method_data("evinote", tokenizer_dir)), _search_target(with_note=True), n, seed=2)
    examples += _warmup_examples(_rows(method_data("search_r1", tokenizer_dir)), _search_target(with_note=False), n // 2, seed=3)
    grace_rows = _rows(method_data("grace", tokenizer_dir))
    for answerable in (True, False):
        subset = [r for r in grace_rows if bool(r["reward_model"]["ground_truth"].get("answerable")) == answerable]
        examples += _warmup_examples(subset, _grace_target, n // 2, seed=4 + answerable)
    pq.write_table(pa.Table.from_pylist(examples), out.with_suffix(".tmp.parquet"))
    out.with_suffix(".tmp.parquet").replace(out)
    return out


# --------------------------------------------------------------------------- policy


def random_policy(directory: Path) -> Path:
    """A randomly initialised 2-layer Qwen2 (hidden 128) with the offline byte-level tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl_evidence.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=POLICY_HIDDEN,
        intermediate_size=POLICY_HIDDEN * 2,
        num_hidden_layers=POLICY_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    directory.mkdir(parents=True, exist_ok=True)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def sft_command(model: Path, train_files: Path, output_dir: Path, epochs: int, lr: float, batch: int, max_length: int) -> list[str]:
    """verl's SFT trainer on one CPU process (the same flags the evipath_sft recipe's --smoke uses)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=1",
        "-m", "verl.trainer.sft_trainer",
        f"model.path={model}", "+model.override_config.attn_implementation=sdpa", "model.enable_gradient_checkpointing=false",
        # Padded batches with per-sequence attention: packing (remove_padding) needs flash-attention's varlen kernels.
        "model.use_remove_padding=false",
        f"data.train_files={train_files}", "data.val_files=null", "data.messages_key=messages",
        f"data.train_batch_size={batch}", f"data.micro_batch_size_per_gpu={batch}", f"data.max_length={max_length}",
        "data.truncation=left", "data.pad_mode=no_padding", "data.num_workers=0",
        f"optim.lr={lr}", "optim.lr_warmup_steps_ratio=0", "optim.weight_decay=0",
        "engine.strategy=fsdp2", "engine.dtype=float32", "engine.use_torch_compile=false",
        f"trainer.total_epochs={epochs}", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.device=cpu",
        f"trainer.default_local_dir={output_dir}", "trainer.logger=[console]", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "checkpoint.save_contents=[model,extra,hf_model]",
        "trainer.project_name=verl-evidence-smoke", "trainer.experiment_name=warmup",
    ]


def cpu_environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(VERL_PLATFORM="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def warmed_up_policy() -> Path:
    """The warmed-up tiny policy (HF directory), built once per machine."""
    root = smoke_dir()
    policy = root / "policy"
    if (policy / "model.safetensors").exists():
        return policy
    with _locked(root / "policy"):
        if (policy / "model.safetensors").exists():
            return policy
        base = random_policy(root / "random_policy")
        data = warmup_data(base)
        work = root / "warmup_run"
        shutil.rmtree(work, ignore_errors=True)
        log = root / "warmup.log"
        with open(log, "w") as handle:
            result = subprocess.run(
                sft_command(base, data, work, WARMUP_EPOCHS, WARMUP_LR, batch=WARMUP_BATCH, max_length=1536),
                env=cpu_environment(), stdout=handle, stderr=subprocess.STDOUT, check=False,
            )
        if result.returncode != 0:
            raise RuntimeError(f"the smoke policy's warm-up (verl SFT trainer) failed; see {log}")
        checkpoints = sorted(work.glob("global_step_*/huggingface"), key=lambda p: int(p.parent.name.split("_")[-1]))
        if not checkpoints or not (checkpoints[-1] / "model.safetensors").exists():
            raise RuntimeError(f"the warm-up finished without a Hugging Face checkpoint in {work}; see {log}")
        shutil.copytree(checkpoints[-1], policy.with_suffix(".tmp"), dirs_exist_ok=True)
        policy.with_suffix(".tmp").replace(policy)
        shutil.rmtree(work, ignore_errors=True)
        (root / "warmup_loss.json").write_text(json.dumps(_losses(log)))
    return policy


def _losses(log: Path) -> list[float]:
    import re

    return [float(x) for x in re.findall(r"train/loss:([0-9.]+)", log.read_text())]


def nli_judge() -> Path:
    from verl_evidence.testing import overlap_nli_model

    out = smoke_dir() / "nli"
    if not (out / "config.json").exists():
        with _locked(out):
            if not (out / "config.json").exists():
                overlap_nli_model(out)
    return out


def prepare(method: str) -> dict[str, str]:
    """What ``recipes/<method>.sh --smoke`` needs: policy, data, and (EviNote) the judge, as shell variables."""
    if method not in METHODS:
        raise ValueError(f"unknown smoke method {method!r}; one of {', '.join(METHODS)}")
    with _locked(smoke_dir() / "prepare"):
        policy = warmed_up_policy()
        if method == "evipath_sft":
            data = warmup_data(policy)
            return {"MODEL_PATH": str(smoke_dir() / "random_policy"), "TRAIN_FILES": str(data)}
        data = method_data(method, policy)
        variables = {"MODEL_PATH": str(policy), "TRAIN_FILES": str(data), "VAL_FILES": str(data)}
        if method == "evinote":
            variables["NLI_MODEL"] = str(nli_judge())
        return variables


def register(root) -> None:
    import shlex

    import typer

    smoke_app = typer.Typer(help="Smoke runs of the recipes on CPU (tiny warmed-up policy, bundled data).", no_args_is_help=True)

    @smoke_app.command("prepare")
    def prepare_command(method: str = typer.Argument(..., help=" | ".join(METHODS))) -> None:
        """Build (or reuse) the smoke policy, data and judge; print them as shell assignments for the recipes."""
        for name, value in prepare(method).items():
            typer.echo(f"{name}={shlex.quote(value)}")

    root.add_typer(smoke_app, name="smoke")
