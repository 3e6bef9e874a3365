"""Smoke runs: a recipe through verl's own trainer on CPU, in about a minute.

``recipes/<name>.sh --smoke`` asks this module for three things and then runs
the recipe's ordinary verl command line in the CPU training mode
(:mod:`verl_evidence.cpu_mode`) with small batch, group and length settings:

1. a tiny policy (a 2-layer Qwen2 of hidden size 128 with the offline
   byte-level tokenizer) **warmed up** (a short supervised loop, :func:`warm_up`)
   on the methods' output formats, built from the bundled questions' gold answers
   and evidence. A random tiny policy scores 0 on every sample, so GRPO's
   advantages and gradients would all be 0 and the run would prove nothing;
   the warm-up makes it write the tags often enough for rewards to differ
   within a group;
2. the method's training data, prepared from the bundled set with the same
   ``verl-evidence data`` commands a user runs, restricted to the questions the
   policy was warmed up on (:func:`warmed_up_rows`);
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
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

# Bump when the policy, the warm-up data or the method data change shape: caches keyed by it are rebuilt.
FORMAT_VERSION = 6
POLICY_HIDDEN = 128
POLICY_LAYERS = 2
WARMUP_ROWS_PER_FORMAT = 8
# Single-example AdamW steps per family (~0.09 CPU-s each for a ~950-token example). The search format
# (query, observation, note, answer) takes longer to pick up than the other two.
WARMUP_STEPS = {"eviomni": 500, "search": 800, "grace": 500}
WARMUP_LR = 3e-3
SMOKE_TOPK = 2  # passages per EviOmni prompt: ~900 tokens with the byte-level tokenizer
# Search recipes: one passage per search cut at this many tokens, and a response budget that holds a query, that
# observation, the final-turn notice, a note and an answer (~330 tokens with the byte-level tokenizer).
SMOKE_MAX_OBS_TOKENS = 96
SMOKE_SEARCH_RESPONSE_LEN = 384

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


def warmed_up_rows(method: str, tokenizer_dir: Path) -> Path:
    """``method``'s prepared rows restricted to the questions its family was warmed up on (cached).

    A 2-layer policy learns the format on the prompts it saw: sampled at temperature
    1, the EviOmni policy closed reason/extract/answer in 13 of 48 samples on its
    warm-up questions and in 1 of 48 on other questions (measured). The search
    recipes' rewards also turn on the exact answer (Search-R1's EM, EviNote's gate),
    which such a policy only knows by heart. Training on those questions is what gives
    every smoke run's GRPO groups a spread at step 2.
    """
    out = smoke_dir() / "data" / f"{method}-warmed.parquet"
    if out.exists():
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    questions = {e["question"] for e in warmup_examples(FAMILIES[method], tokenizer_dir) if "question" in e}
    rows = [r for r in _rows(method_data(method, tokenizer_dir)) if r["extra_info"]["question"] in questions]
    tmp = out.with_suffix(".tmp.parquet")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(out)
    return out


def _rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _first(values, default: str = "") -> str:
    values = list(values or [])
    return str(values[0]) if values else default


def _warmup_examples(rows: list[dict], target: Callable[[dict], list[dict] | None], count: int, seed: int) -> list[dict]:
    """Chat examples: the row's prompt and an assistant reply (a message, or ``segments`` of one turn)."""
    examples = []
    for row in random.Random(seed).sample(rows, len(rows)):
        reply = target(row)
        question = row["extra_info"]["question"]
        if reply and "role" in reply[0]:
            examples.append({"messages": list(row["prompt"]) + reply, "question": question})
        elif reply:
            text = "".join(segment["text"] for segment in reply)
            messages = list(row["prompt"]) + [{"role": "assistant", "content": text}]
            examples.append({"messages": messages, "segments": reply, "question": question})
        if len(examples) == count:
            break
    return examples


def _short(text: str, words: int = 8) -> str:
    # Short spans: the warm-up teaches the format; copying long spans is what RL is for.
    return " ".join(text.split()[:words])


def _eviomni_target(row: dict) -> list[dict] | None:
    truth = row["reward_model"]["ground_truth"]
    evidence, answer = _first(truth.get("evidence")), _first(truth.get("target"))
    if not evidence or not answer:
        return None
    reply = f"<reason>One passage answers it.</reason><extract>{_short(evidence)}</extract><answer>{answer}</answer>"
    return [{"role": "assistant", "content": reply}]


def _eviomni_masked_answers(rows: list[dict], count: int) -> list[dict]:
    """The o_r / o_e prompts (knowledge-masked inputs) the EviOmni loop asks the same policy to answer."""
    from verl_evidence.prompts import load_prompt, render_prompt
    from verl_evidence.tools.documents import format_documents

    template = load_prompt("eviomni_answer")
    examples = []
    for index, row in enumerate(rows[:count]):
        truth = row["reward_model"]["ground_truth"]
        evidence, answer = _first(truth.get("evidence")), _first(truth.get("target"))
        passages = format_documents([{"document": p} for p in row["extra_info"].get("passages") or []])
        masked = "[hidden]"
        fields = {"question": row["extra_info"]["question"], "passages": passages, "rationale": "One passage answers it.", "evidence": _short(evidence)}
        fields["evidence" if index % 2 else "passages"] = masked
        if index % 2 == 0:
            fields["rationale"] = masked
        prompt = render_prompt(template, **fields)
        examples.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": f"<answer>{answer}</answer>"}]})
    return examples


def _search_target(with_note: bool, tokenizer) -> Callable[[dict], list[dict] | None]:
    """One search, its observation, (a note,) the answer: laid out token for token as the search loop builds it.

    The policy's turns are encoded on their own and the context between them is the
    loop's own pieces (``INFORMATION_OPEN``, the document tokens cut at the smoke
    run's ``max_obs_tokens``, ``INFORMATION_CLOSE``, the final-turn notice), so the
    tiny policy sees at warm-up exactly the token sequence it continues at rollout.
    Context pieces carry no loss (``trained: False``), as they carry no loss in RL.
    """
    from verl_evidence.agent_loops.common import encode
    from verl_evidence.agent_loops.search_loop import INFORMATION_CLOSE, INFORMATION_OPEN, SearchLoopSettings
    from verl_evidence.bundled import load_corpus
    from verl_evidence.tools.documents import format_documents

    corpus = {doc["id"]: doc["contents"] for doc in load_corpus()}
    notice = SearchLoopSettings().final_turn_notice  # the smoke run allows one search: its answer turn is the last

    def target(row: dict) -> list[dict] | None:
        truth = row["reward_model"]["ground_truth"]
        evidence, answer = _first(truth.get("evidence")), _first(truth.get("target"))
        question = row["extra_info"]["question"]
        passage = next((text for text in corpus.values() if evidence and evidence in text), None)
        if not answer or passage is None:
            return None
        documents = encode(tokenizer, format_documents([{"document": {"id": "d", "contents": passage}}]))
        observation = tokenizer.decode(documents[:SMOKE_MAX_OBS_TOKENS])
        note = f"<summary>*{_short(evidence, 6)}*</summary>\n" if with_note else ""
        return [
            {"text": f"<search>{_short(question, 6)}</search>", "trained": True},
            {"text": INFORMATION_OPEN, "trained": False},
            {"text": observation, "trained": False, "ids": documents[:SMOKE_MAX_OBS_TOKENS]},
            {"text": INFORMATION_CLOSE, "trained": False},
            {"text": notice, "trained": False},
            {"text": f"{note}<answer>{answer}</answer>", "trained": True},
        ]

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
        return [{"role": "assistant", "content": f"<evidence>{_short(evidence)}</evidence>\n<answer>{answer}</answer>"}]
    return [{"role": "assistant", "content": f"<llm>I recall it.</llm>\n<answer>{answer}</answer>"}]


# Recipe settings one method's smoke run needs beyond the common smoke defaults (recipes/_common.sh).
METHOD_SETTINGS = {
    # Search-R1 scores exact match alone. verl's seeded shuffle gives each step the same questions, and the tiny
    # policy answers only one or two of the eight at all (seen in a rollout dump). At temperature 1.0, step 2's
    # answerable question was right in 7-8 of its 8 samples, so about 1 run in 3 had no group with a spread at
    # step 2. At 1.3 it is right in about 5 of 8, and a group with a spread is expected in ~98 % of runs.
    # Four groups per step, not two.
    "search_r1": {"BATCH": "4", "TEMPERATURE": "1.3"},
}

FAMILIES = {  # recipes that share a prompt format share a warmed-up policy
    "eviomni": "eviomni", "lear": "eviomni", "composite": "eviomni",
    "evinote": "search", "search_r1": "search",
    "grace": "grace",
}


def warmup_examples(family: str, tokenizer_dir: Path) -> list[dict]:
    """Chat examples (``messages``) in the output format of one family of recipes."""
    n = WARMUP_ROWS_PER_FORMAT
    if family == "eviomni":
        rows = _rows(method_data("eviomni", tokenizer_dir))
        # Mostly the trained (r, e, o_f) format; a few knowledge-masked answer prompts (o_r, o_e) so those answers
        # keep their tags, but not so many that "</answer>" crowds out "</reason>" in a model this small.
        return _warmup_examples(rows, _eviomni_target, n, seed=1) + _eviomni_masked_answers(rows, 2)
    if family == "search":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        with_note = _warmup_examples(_rows(method_data("evinote", tokenizer_dir)), _search_target(True, tokenizer), n, seed=2)
        # Search-R1's prompt with the same questions, without notes: its exact-match reward then has answers to find.
        questions = {e["question"] for e in with_note}
        search_r1 = [r for r in _rows(method_data("search_r1", tokenizer_dir)) if r["extra_info"]["question"] in questions]
        return with_note + _warmup_examples(search_r1, _search_target(False, tokenizer), n // 4, seed=3)
    if family == "grace":
        rows = _rows(method_data("grace", tokenizer_dir))
        examples = []
        for answerable in (True, False):
            subset = [r for r in rows if bool(r["reward_model"]["ground_truth"].get("answerable")) == answerable]
            examples += _warmup_examples(subset, _grace_target, n // 2, seed=4 + answerable)
        return examples
    raise ValueError(f"unknown warm-up family {family!r}")


def warmup_data(tokenizer_dir: Path) -> Path:
    """Every family's examples as chat-format parquet (``messages``): the data of the evipath_sft smoke run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = smoke_dir() / "data" / "warmup.parquet"
    if out.exists():
        return out
    examples = [
        {"messages": e["messages"]}  # verl's SFT data: chat messages only
        for family in sorted(set(FAMILIES.values())) for e in warmup_examples(family, tokenizer_dir)
    ]
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


def _example_ids(tokenizer, example: dict) -> tuple[list[int], list[int]]:
    """Token ids and labels of one example: loss on what the policy writes, -100 on prompt and context."""
    messages = list(example["messages"])
    prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if "segments" not in example:
        full = tokenizer.apply_chat_template(messages, tokenize=False)
        full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        return full_ids, [-100] * len(prompt_ids) + full_ids[len(prompt_ids) :]
    from verl_evidence.agent_loops.search_loop import assistant_turn_end_ids

    ids, labels = list(prompt_ids), [-100] * len(prompt_ids)
    for segment in example["segments"]:
        piece = segment.get("ids") or tokenizer(segment["text"], add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if segment["trained"] else [-100] * len(piece)
    end = assistant_turn_end_ids(tokenizer)  # the turn ends (EOS) after the answer
    return ids + end, labels + end


def warm_up(base: Path, examples: list[dict], out: Path, steps: int = 500, lr: float = WARMUP_LR) -> list[float]:
    """Supervised warm-up on ``examples``: loss on the assistant turn only, one example per AdamW step.

    A plain PyTorch loop, not verl's SFT trainer: on CPU verl's trainer spends about
    5x the CPU time per example (0.5 s against 0.09 s measured here for a ~950-token
    example), and the warm-up runs before every first smoke run on a machine and in
    CI. verl's SFT trainer itself is exercised by ``recipes/evipath_sft.sh --smoke``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread does the most work per CPU-second
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="sdpa")
    encoded = []
    for example in examples:
        full_ids, labels = _example_ids(tokenizer, example)
        encoded.append((torch.tensor([full_ids]), torch.tensor([labels])))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    order = random.Random(0)
    losses: list[float] = []
    model.train()
    queue: list[int] = []
    for _ in range(steps):
        if not queue:
            queue = order.sample(range(len(encoded)), len(encoded))
        input_ids, labels = encoded[queue.pop()]
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(round(loss.item(), 4))
    model.eval()
    torch.set_num_threads(threads)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return losses


def warmed_up_policy(family: str) -> Path:
    """The tiny policy warmed up on one family's format (HF directory), built once per machine."""
    root = smoke_dir()
    policy = root / f"policy-{family}"
    if (policy / "model.safetensors").exists():
        return policy
    with _locked(policy):
        if not (policy / "model.safetensors").exists():
            base = random_policy(root / "random_policy") if not (root / "random_policy" / "model.safetensors").exists() else root / "random_policy"
            losses = warm_up(base, warmup_examples(family, base), policy, steps=WARMUP_STEPS.get(family, 500))
            (root / f"warmup-{family}.json").write_text(json.dumps({"steps": len(losses), "loss": losses}))
            logger.info("smoke policy %s: warm-up loss %.3f -> %.3f", family, losses[0], sum(losses[-20:]) / 20)
    return policy


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
    root = smoke_dir()
    with _locked(root / "prepare"):
        base = root / "random_policy"
        if not (base / "model.safetensors").exists():
            random_policy(base)
        if method == "evipath_sft":  # verl's SFT trainer from the random policy on every family's format
            return {"MODEL_PATH": str(base), "TRAIN_FILES": str(warmup_data(base))}
        policy = warmed_up_policy(FAMILIES[method])
        data = warmed_up_rows(method, policy)
        variables = {"MODEL_PATH": str(policy), "TRAIN_FILES": str(data), "VAL_FILES": str(data)}
        if FAMILIES[method] == "search":
            variables.update(MAX_OBS_TOKENS=str(SMOKE_MAX_OBS_TOKENS), RESPONSE_LEN=str(SMOKE_SEARCH_RESPONSE_LEN))
        variables.update(METHOD_SETTINGS.get(method, {}))
        if method == "evinote":
            variables["NLI_MODEL"] = str(nli_judge())
        return variables


def shell_assignments(method: str) -> list[str]:
    """``prepare(method)`` as ``NAME=value`` lines a recipe reads (values shell-quoted)."""
    import shlex

    return [f"{name}={shlex.quote(value)}" for name, value in prepare(method).items()]


def register(root) -> None:
    import typer

    smoke_app = typer.Typer(help="Smoke runs of the recipes on CPU (tiny warmed-up policy, bundled data).", no_args_is_help=True)

    @smoke_app.command("prepare")
    def prepare_command(method: str = typer.Argument(..., help=" | ".join(METHODS))) -> None:
        """Build (or reuse) the smoke policy, data and judge; print them as shell assignments for the recipes."""
        for line in shell_assignments(method):
            typer.echo(line)

    root.add_typer(smoke_app, name="smoke")


def main(argv: list[str] | None = None) -> int:
    """``python -m verl_evidence.smoke prepare METHOD``: what the recipes call (``verl-evidence smoke prepare``
    without importing every command of the CLI, which costs seconds on a small machine)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "prepare":
        print(f"usage: python -m verl_evidence.smoke prepare {{{','.join(METHODS)}}}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        lines = shell_assignments(args[1])
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
