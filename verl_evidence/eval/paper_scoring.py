"""Scoring as the papers score, after the rollouts: EviOmni/LEAR's reader, GRACE's BERTScore F1 and LLM judge.

- **Reader** (EviOmni §4.1 / Appendix A, LEAR §4.1): the papers do not score the
  extractor's own answer; a separate QA generator (Qwen2.5-Instruct tuned with
  LoRA rank 8) answers each question from the extracted evidence with the
  retrieval-augmented QA prompt (EviOmni Table 11), and that answer gets EM/F1.
  ``eval --reader`` takes the reader as a local HF model directory or an
  OpenAI-compatible endpoint; its prompt is the swappable ``eviomni_reader`` file.
- **BERTScore F1** (GRACE §4.3: answerable questions, ``bert-base-uncased``):
  the ``bert-score`` package, the model by name or local directory.
- **LLM judge** (GRACE §4.3: LJ, DeepSeek-V3.2-chat): any OpenAI-compatible
  endpoint (or a local HF model directory) with the swappable ``grace_judge``
  prompt; one verdict per example: a right answer where the evidence was
  retrieved, a signalled lack of evidence where it was not.

Results are stored on the records (and appended to the results cache), keyed by
the reader's / judge's identity and prompt, so a rerun with the same settings
asks nothing again and a changed reader or prompt is asked anew. Set-up problems
(package, model, unreachable endpoint) raise :class:`PaperScoringError` with a
one-line message before any rollout starts; a malformed judge reply leaves the
verdict empty with a logged reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_evidence.eval.records import EvalRecord
from verl_evidence.prompts import check_placeholders, load_prompt, placeholders, render_prompt
from verl_evidence.text.tags import extract_last, strip_thinking

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BERTSCORE_MODEL",
    "BertScorer",
    "Judge",
    "PaperScoringError",
    "Reader",
    "chat_model",
    "parse_reader_answer",
    "parse_verdict",
    "score_as_the_papers",
]

DEFAULT_BERTSCORE_MODEL = "bert-base-uncased"  # GRACE §4.3 ("bert-baes-uncased", sic)
READER_PROMPT = "eviomni_reader"
JUDGE_PROMPT = "grace_judge"
# Greedy and short, as a QA generator's answer is scored; a judge says one word.
READER_SAMPLING = {"temperature": 0.0, "max_tokens": 64}
JUDGE_SAMPLING = {"temperature": 0.0, "max_tokens": 16}


class PaperScoringError(ValueError):
    """A reader, judge or BERTScore model that cannot be used; the message is one line naming it and the fix."""


class HFChatModel:
    """A local Hugging Face causal LM answering chat messages (its own chat template), greedy by default."""

    def __init__(self, model_dir: str | Path) -> None:
        from verl_evidence.local.backends import HFGenerationBackend

        self.backend = HFGenerationBackend.from_pretrained(model_dir)
        self.tokenizer = self.backend.tokenizer
        self._requests = 0

    async def chat(self, messages: list[dict[str, str]], sampling_params: dict[str, Any]) -> str:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = self.tokenizer.encode(text, add_special_tokens=False)
        self._requests += 1
        output = await self.backend.generate(
            f"paper-scoring-{self._requests}", prompt_ids=prompt_ids, sampling_params=dict(sampling_params)
        )
        return self.tokenizer.decode(output.token_ids, skip_special_tokens=True)


def _endpoint_reachable(base_url: str, what: str) -> None:
    """One GET to the server: any HTTP answer will do; no answer at all ends here, in one line."""
    import httpx

    try:
        httpx.get(f"{base_url}/models", timeout=10.0)
    except httpx.HTTPError as err:
        raise PaperScoringError(f"{what} {base_url}: no answer ({type(err).__name__}: {err})") from err


def chat_model(target: str, served_model: str | None, what: str):
    """``(model, identity)`` for a local HF model directory or an OpenAI-compatible endpoint URL."""
    if target.startswith(("http://", "https://")):
        if not served_model:
            raise PaperScoringError(f"{what} {target} is an endpoint: give the model name it serves ({what}-model)")
        from verl_evidence.agent_loops.openai_endpoint import OpenAIEndpoint

        # a hosted judge needs a key; vLLM takes any (as `evipath synth` reads it)
        endpoint = OpenAIEndpoint(target, served_model, api_key=os.environ.get("OPENAI_API_KEY") or "EMPTY")
        _endpoint_reachable(endpoint.base_url, what)
        return endpoint, f"endpoint:{endpoint.base_url}#{served_model}"
    directory = Path(target).expanduser()
    if not (directory / "config.json").is_file():
        raise PaperScoringError(
            f"{what} {target}: neither an http(s):// endpoint nor a Hugging Face model directory (no config.json)"
        )
    try:
        return HFChatModel(directory), f"hf:{directory.resolve()}"
    except (OSError, ValueError) as err:
        raise PaperScoringError(f"{what} {target}: cannot load the model ({type(err).__name__}: {err})") from err


def _template(prompt: str | Path | None, default: str, required: set[str], what: str) -> tuple[str, str]:
    """The prompt template and a short hash of it (part of the results' identity)."""
    try:
        template = load_prompt(str(prompt) if prompt is not None else default)
        check_placeholders(template, required, name=f"{what} prompt")
    except (FileNotFoundError, ValueError) as err:
        raise PaperScoringError(f"{what}: {err}") from err
    return template, hashlib.sha256(template.encode()).hexdigest()[:8]


def parse_reader_answer(text: str) -> str:
    """The reader's short answer: an ``<answer>`` block if it wrote one, else its first non-empty line."""
    final = strip_thinking(text or "")
    tagged = extract_last(final, "answer")
    if tagged is not None:
        return tagged.strip()
    for line in final.splitlines():
        line = re.sub(r"^\s*answer\s*:\s*", "", line.strip(), flags=re.I)
        if line:
            return line
    return ""


_VERDICT = re.compile(r"\b(INCORRECT|CORRECT)\b")


def parse_verdict(text: str) -> bool | None:
    """The judge's last CORRECT / INCORRECT (upper case, a word of its own); ``None`` if it gave neither."""
    found = _VERDICT.findall(strip_thinking(text or ""))
    return None if not found else found[-1] == "CORRECT"


READER_MERGE_DIR = "with_lora"


def reader_cache_dir() -> Path:
    """Where merged reader checkpoints go: ``$VERL_EVIDENCE_CACHE/readers`` (default ``~/.cache/verl-evidence``)."""
    root = os.environ.get("VERL_EVIDENCE_CACHE") or "~/.cache/verl-evidence"
    return Path(root).expanduser() / "readers"


def reader_model_dir(target: str | Path, cache_dir: str | Path | None = None) -> Path:
    """A Hugging Face model directory for ``--reader``: ``target`` itself, or the merge of a verl SFT checkpoint.

    A ``global_step_N`` directory of ``recipes/eviomni_reader_sft.sh`` holds FSDP shards: verl's model merger writes
    the base weights and, for a LoRA run, the adapter beside them (``lora_adapter/``), which is applied to the
    weights here with peft (once per checkpoint, cached under ``cache_dir``), so the reader answers as trained.
    """
    from verl_evidence.eval.checkpoints import CheckpointError, find_checkpoint, merge_checkpoint

    directory = Path(target).expanduser()
    if (directory / "config.json").is_file():
        return apply_lora_adapter(directory)  # a model directory, perhaps verl's merge of a LoRA run
    if not directory.is_dir():
        return directory  # chat_model says what is wrong
    try:
        merged = merge_checkpoint(find_checkpoint(directory), cache_dir or reader_cache_dir()).model_dir
    except CheckpointError as err:
        raise PaperScoringError(str(err).replace("--checkpoint", "--reader", 1)) from err
    return apply_lora_adapter(merged)


def apply_lora_adapter(model_dir: Path) -> Path:
    """``model_dir`` with its ``lora_adapter/`` (verl's merger layout) merged into the weights, saved once beside it;
    ``model_dir`` itself when it has no adapter."""
    adapter = model_dir / "lora_adapter"
    if not (adapter / "adapter_config.json").is_file():
        return model_dir
    target = model_dir / READER_MERGE_DIR
    if (target / "config.json").is_file():
        return target
    from filelock import FileLock

    with FileLock(str(model_dir / f".{READER_MERGE_DIR}.lock")):
        if (target / "config.json").is_file():
            return target
        try:
            from peft import PeftModel
        except ImportError as err:
            raise PaperScoringError(f"--reader {model_dir}: a LoRA checkpoint needs peft: pip install peft") from err
        from transformers import AutoModelForCausalLM, AutoTokenizer

        partial = model_dir / f".{READER_MERGE_DIR}.partial-{os.getpid()}"
        base = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype="auto")
        PeftModel.from_pretrained(base, adapter).merge_and_unload().save_pretrained(partial)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(partial)
        os.replace(partial, target)
    logger.info("reader: LoRA adapter %s merged into %s", adapter, target)
    return target


@dataclass
class Reader:
    """EviOmni/LEAR's separate QA generator: answers from the extracted evidence only."""

    model: Any
    identity: str
    template: str

    @classmethod
    def create(cls, target: str, served_model: str | None = None, prompt: str | Path | None = None) -> Reader:
        # {document} may be absent: the closed-book prompt (eviomni_closed_book) is the papers' Zero baseline
        template, digest = _template(prompt, READER_PROMPT, {"question"}, "--reader")
        unknown = placeholders(template) - {"question", "document"}
        if unknown:
            raise PaperScoringError(f"--reader prompt has placeholder(s) the reader cannot fill: {sorted(unknown)}")
        if not str(target).startswith(("http://", "https://")):
            target = str(reader_model_dir(target))  # a verl SFT checkpoint (the reader recipe's) is merged first
        model, identity = chat_model(target, served_model, "--reader")
        return cls(model, f"{identity}|prompt:{digest}", template)

    def wants(self, record: EvalRecord) -> bool:
        return record.rollout == "eviomni" and record.error is None and record.reader != self.identity

    async def __call__(self, record: EvalRecord) -> None:
        prompt = render_prompt(self.template, question=record.question, document=record.evidence or "")
        reply = await self.model.chat([{"role": "user", "content": prompt}], READER_SAMPLING)
        record.reader_prediction = parse_reader_answer(reply)
        record.reader = self.identity


@dataclass
class Judge:
    """GRACE's LLM judge: one CORRECT / INCORRECT verdict per labelled GRACE example."""

    model: Any
    identity: str
    template: str

    @classmethod
    def create(cls, target: str, served_model: str | None = None, prompt: str | Path | None = None) -> Judge:
        required = {"question", "gold_answers", "evidence_status", "response"}
        template, digest = _template(prompt, JUDGE_PROMPT, required, "--judge")
        model, identity = chat_model(target, served_model, "--judge")
        return cls(model, f"{identity}|prompt:{digest}", template)

    def wants(self, record: EvalRecord) -> bool:
        return (
            record.rollout == "grace"
            and record.error is None
            and record.answerable is not None
            and record.judge != self.identity
        )

    async def __call__(self, record: EvalRecord) -> None:
        prompt = render_prompt(
            self.template,
            question=record.question,
            gold_answers="; ".join(record.golden_answers) or "(none given)",
            evidence_status="yes" if record.answerable else "no",
            response=strip_thinking(record.response).strip(),
        )
        reply = await self.model.chat([{"role": "user", "content": prompt}], JUDGE_SAMPLING)
        record.judge_correct = parse_verdict(reply)
        record.judge = self.identity
        if record.judge_correct is None:
            logger.warning("judge gave no verdict for %s: %r", record.example_id, reply[:200])


class BertScorer:
    """BERTScore F1 of GRACE's answers against the gold answers (the best over several), with ``bert-score``."""

    def __init__(self, model: str = DEFAULT_BERTSCORE_MODEL, num_layers: int | None = None, device: str | None = None):
        try:
            from bert_score import BERTScorer
        except ImportError as err:
            raise PaperScoringError(
                "--bertscore needs the bert-score package: pip install 'verl-evidence[eval]'"
            ) from err
        if model.startswith(("/", ".", "~")) and not Path(model).expanduser().is_dir():  # a path, not a hub name
            raise PaperScoringError(f"--bertscore-model {model}: no such directory")
        try:
            self.scorer = BERTScorer(model_type=model, num_layers=num_layers, device=device)
        except KeyError as err:
            raise PaperScoringError(
                f"--bertscore-model {model}: bert-score has no default layer for it; give --bertscore-layers N"
            ) from err
        except (OSError, ValueError) as err:
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise PaperScoringError(f"--bertscore-model {model}: cannot load it ({first_line})") from err
        self.identity = f"{model}@{self.scorer.num_layers}"

    def wants(self, record: EvalRecord) -> bool:
        return (
            record.rollout == "grace"
            and record.error is None
            and record.answerable is True
            and bool(record.golden_answers)
            and record.bertscore_model != self.identity
        )

    def score(self, records: Sequence[EvalRecord]) -> None:
        """Fill ``bertscore_f1`` of ``records``; an empty answer scores 0 (bert-score warns on empty text)."""
        answered = [r for r in records if (r.prediction or "").strip()]
        if answered:
            _, _, f1 = self.scorer.score(
                [r.prediction for r in answered], [list(r.golden_answers) for r in answered], verbose=False
            )
            for record, value in zip(answered, f1.tolist()):
                record.bertscore_f1 = float(value)
        for record in records:
            if record not in answered:
                record.bertscore_f1 = 0.0
            record.bertscore_model = self.identity


def score_as_the_papers(
    records: Sequence[EvalRecord],
    *,
    reader: Reader | None = None,
    judge: Judge | None = None,
    bertscore: BertScorer | None = None,
    concurrency: int = 4,
    on_update: Callable[[EvalRecord], None] | None = None,
) -> tuple[int, list[str]]:
    """Run BERTScore, the reader and the judge on the records that need them (in place).

    Returns how many records changed and one line per request that failed (its record keeps no
    result, so the next run asks again). ``on_update`` gets each changed record as soon as it is
    done (the CLI appends it to the results cache).
    """
    changed = 0
    if bertscore is not None:
        todo = [r for r in records if bertscore.wants(r)]
        bertscore.score(todo)
        for record in todo:
            if on_update is not None:
                on_update(record)
        changed += len(todo)
    asks = [(step, r) for step in (reader, judge) if step is not None for r in records if step.wants(r)]
    failures: list[str] = []
    if asks:

        async def run_all() -> int:
            semaphore = asyncio.Semaphore(max(1, concurrency))

            async def one(step, record: EvalRecord) -> int:
                async with semaphore:
                    try:
                        await step(record)
                    except Exception as err:  # one failed request must not lose the others: reported below
                        name = "reader" if step is reader else "judge"
                        failures.append(f"{name} on {record.example_id}: {type(err).__name__}: {err}")
                        logger.warning("%s", failures[-1])
                        return 0
                if on_update is not None:
                    on_update(record)
                return 1

            return sum(await asyncio.gather(*(one(step, r) for step, r in asks)))

        changed += asyncio.run(run_all())
    return changed, failures
