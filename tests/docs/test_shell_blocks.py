"""What the user-facing pages tell a user to type runs, block by block, in page order, on stand-ins of the real files.

Every command of every shell block of ``PAGES`` either runs or is listed in ``SKIPPED`` with the reason (a
command in neither fails ``test_every_documented_command_is_run_or_skipped_with_a_reason``, and so does an entry
that names no command any more). The stand-ins have the formats users have:

- ``/data/wiki-18.jsonl``: a FlashRAG corpus (the bundled one, ``{"id", "contents": "Title\\ntext"}``);
- ``/data/e5_Flat.index``: a Search-R1-style ``faiss.IndexFlatIP`` of those passages' normalised mean-pooled vectors
  (the bundled index's own file), with the packaged MiniLM standing for ``intfloat/e5-base-v2`` (no hub here);
- ``nq_train.jsonl`` …: FlashRAG QA JSONL (the bundled questions); ``nq_hotpotqa_train/*.parquet``: Search-R1's
  merged parquet schema (benchmarks/search_r1_files.py); HotpotQA and QASPER files of their original layout;
- hub models by name: the offline tiny tokenizer, the overlap NLI judge, a one-label tiny cross-encoder.

Only the placeholders of ``STAND_INS`` are rewritten (paths, hub names, the port 8000 a shared machine may not
have free). A GPU training (a recipe without ``--smoke``/``--dry-run``/``--cfg``) runs with the recipes'
``--dry-run`` switch (``DRY_RUN``). A server a page starts (``... serve ... &``, or a foreground ``serve`` that a user
leaves running in a terminal) is stopped when the page ends. A command that exits non-zero fails its page's test
naming page, line and command. The commands run through ``bash -c`` in a fresh directory per page with the
``verl-evidence`` console scripts of this venv (tests/conftest.py puts this checkout on ``PYTHONPATH``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .test_docs import ROOT, code_blocks

PAGES = (
    "docs/quickstart.md",
    "docs/recipes.md",
    "docs/retrieval-server.md",
    "docs/data-preparation.md",
    "docs/evaluation.md",
    "docs/debug-on-cpu.md",
)
SHELL = ("bash", "sh", "shell", "console")

# Commands not run, by (page, start of the command): why, and where the suite runs the same thing instead.
SKIPPED: dict[tuple[str, str], str] = {
    (
        "docs/quickstart.md",
        "make demo",
    ): "make reinstalls the venv; `verl-evidence demo` runs in tests/demo/test_demo.py",
    ("docs/quickstart.md", "make test"): "the suite itself",
    ("docs/quickstart.md", "python -m venv .venv"): "the installation: the suite runs inside the installed venv",
    ("docs/quickstart.md", "pip install torch"): "the installation (network)",
    ("docs/quickstart.md", 'pip install -e ".[serve,vllm]"'): "the installation (vLLM needs a GPU): "
    "tests/docs/test_installs.py resolves it for Linux x86_64",
    ("docs/quickstart.md", "pip uninstall -y faiss-cpu"): "the installation of faiss-gpu (GPU): "
    "tests/docs/test_installs.py resolves `.[serve,vllm,gpu]`",
    ("docs/quickstart.md", "pip install uv"): "the installation (network): `make install` installs uv the same way",
    ("docs/quickstart.md", 'uv pip install -e ".[serve,sglang]"'): "the installation (SGLang needs a GPU): "
    "tests/docs/test_installs.py resolves it with the override file for Linux x86_64",
    ("docs/quickstart.md", 'python -c "import verl;'): "a plain `import verl` resolving our reward managers by name: "
    "the session's verl_import_probe (tests/adapters/test_registration_hook.py) runs exactly that",
    ("docs/quickstart.md", "verl-evidence index convert"): "~65 CPU-s for the 322-vector stand-in (faiss trains "
    "IVF8,PQ48 codebooks); `convert` runs in tests/retrieval/test_adopt.py::test_convert_reports_recall_against_flat",
    ("docs/quickstart.md", "verl-evidence index build"): "an E5 encode on CUDA into IVF4096 (needs >= 160k "
    "passages): `index build` runs on CPU in tests/retrieval/test_index.py",
    ("docs/quickstart.md", "verl-evidence index recall"): "reads the IVF4096 index of the GPU build above; "
    "`index recall` runs on docs/retrieval-server.md's page and in tests/retrieval/test_recall.py",
    ("docs/quickstart.md", "python -m verl.model_merger"): "needs a 7B run's FSDP shards; verl's merger runs on the "
    "shared smoke run's checkpoints in tests/eval/test_checkpoint_eval.py (`eval --checkpoint`)",
    ("docs/quickstart.md", "vllm serve"): "the GPU inference engine",
    ("docs/quickstart.md", "verl-evidence eval --endpoint"): "needs the vLLM endpoint above; `eval` against an "
    "OpenAI-compatible endpoint runs in tests/eval/test_eval_cli.py",
    ("docs/recipes.md", "bash recipes/eviomni_grpo.sh --smoke"): "the session's EviOmni smoke run "
    "(tests/conftest.py::eviomni_smoke_run, read by tests/recipes/test_smoke_training.py)",
    ("docs/recipes.md", "bash recipes/grace_dapo.sh --no-server --cfg job --resolve"): "Hydra's --cfg through "
    "main_ppo, as tests/recipes/test_recipes.py::test_cfg_job_runs_the_real_entry_point runs it",
    ("docs/retrieval-server.md", "verl-evidence serve #"): "the bundled server is the session's `retrieval_server` "
    "(tests/conftest.py); the CLI's start and stop: tests/retrieval/test_ingress.py",
    ("docs/retrieval-server.md", "verl-evidence index build --corpus wiki.jsonl"): "IVF65536 trains on 2.6M "
    "passages; `index build` runs in tests/retrieval/test_index.py",
    ("docs/retrieval-server.md", "verl-evidence serve --index-dir /data/idx --replicas 2 --gpus-per-replica 1"): (
        "GPU replicas"
    ),
    ("docs/retrieval-server.md", "retrieval-server {serve,"): "a synopsis, not a command: "
    "each one's --help runs in tests/cli/test_command_line.py",
    ("docs/retrieval-server.md", "verl-evidence index verify --index-dir /data/idx"): "checks /data/idx, the "
    "IVF65536 build skipped above; `index verify` (and --record) runs in tests/retrieval/test_startup_checks.py",
    ("docs/retrieval-server.md", "retrieval-server convert"): "~65 CPU-s for the 322-vector stand-in (see quickstart); "
    "`convert` runs in tests/retrieval/test_adopt.py::test_convert_reports_recall_against_flat",
    ("docs/retrieval-server.md", "retrieval-server serve --index-dir /data/wiki18-e5 --mmap-index"): "the adopted "
    "Flat index served from the command line: docs/quickstart.md's step 3 (`verl-evidence serve`, the same command), "
    "memory-mapped: tests/retrieval/test_adopt.py::test_converted_index_serves_memory_mapped (a server start is "
    "~15 CPU-s: one a page is enough)",
    ("docs/retrieval-server.md", "retrieval-server serve --index-dir /data/wiki18-e5-pq"): "serves the conversion "
    "skipped above",
    ("docs/data-preparation.md", "verl-evidence data grace bundled"): "53 CPU-s (five retrievers, two of them "
    "encoding the corpus, over the 80 bundled questions); the same five with a cross-encoder on a small set: "
    "tests/dataprep/test_cli.py::test_grace_cli_prints_statistics, the bundled set: test_grace_on_the_bundled_set",
    (
        "docs/data-preparation.md",
        "verl-evidence data grace hotpot_train_v1.1.json --style hotpotqa --sample 2000 --seed 0 -o",
    ): "needs HotpotQA's training file (not in CI); the same construction on a HotpotQA-layout file: "
    "tests/dataprep/test_grace_paper_settings.py",
    (
        "docs/data-preparation.md",
        "verl-evidence data grace hotpot_dev_distractor_v1.json --style hotpotqa --split test --sample 500 --seed 0 "
        "--dense-model",
    ): "with the stand-ins the same run as this page's test-set command without --dense-model (its default dense "
    "model is the MiniLM that stands for Qwen3-Embedding here; ~9 CPU-s); --dense-model by name: the training-set "
    "command above it",
    ("docs/data-preparation.md", "verl-evidence data inspect data/grace/train.parquet"): "the file of the two "
    "commands above, both skipped; `data inspect` runs in quickstart (step 4)",
    ("docs/evaluation.md", "verl-evidence eval --out outputs/eval"): "replayed trajectories through the CLI (on the "
    "session's server, not an embedded one): "
    "tests/eval/test_eval_cli.py::test_eval_command_writes_report_and_resumes_from_its_cache",
    ("docs/evaluation.md", "verl-evidence eval --model /ckpt/qwen2.5-3b-evinote"): "a local HF policy: "
    "tests/eval/test_eval_cli.py::test_a_local_hf_model_directory_runs_as_the_policy",
    ("docs/evaluation.md", "verl-evidence eval --checkpoint"): "tests/eval/test_checkpoint_eval.py evaluates the "
    "shared smoke run's global_step_1 and global_step_2 this way",
    ("docs/evaluation.md", "python -m verl.model_merger"): "see quickstart: needs a run's FSDP shards",
    ("docs/evaluation.md", "vllm serve"): "the GPU inference engine",
    ("docs/evaluation.md", "verl-evidence eval --endpoint"): "needs the vLLM endpoint above",
    ("docs/evaluation.md", "make demo"): "make reinstalls the venv; `verl-evidence demo` runs in tests/demo",
    ("docs/evaluation.md", "verl-evidence demo --quick"): "tests/demo/test_demo.py runs `demo --quick`",
    ("docs/evaluation.md", "verl-evidence demo --train"): "20 CPU GRPO steps of `eviomni_grpo.sh --smoke` (the "
    "session's smoke run trains it); tests/demo/test_training.py composes the demo's overrides with the recipe",
    ("docs/evaluation.md", "verl-evidence demo --model"): "the demo's policy backends are eval's: a local HF policy "
    "in tests/eval/test_eval_cli.py::test_a_local_hf_model_directory_runs_as_the_policy",
    ("docs/evaluation.md", "verl-evidence demo --nli-model"): "the demo once more (tests/demo/test_demo.py) with a "
    "judge loaded by path, as tests/adapters/test_judge_ray.py loads one",
    ("docs/debug-on-cpu.md", "bash recipes/eviomni_grpo.sh --smoke"): "the session's EviOmni smoke run "
    "(tests/conftest.py::eviomni_smoke_run)",
    ("docs/debug-on-cpu.md", "make smoke"): "make reinstalls the venv; the smoke runs of tests/recipes",
}
# GPU trainings run with the recipes' --dry-run: the whole command is printed, nothing trains. (A `--smoke` run
# here would repeat a training the suite already pays for: its reason names where.)
DRY_RUN: dict[tuple[str, str], str] = {
    ("docs/quickstart.md", "RETRIEVAL_URL=http://127.0.0.1:8000 NLI_MODEL="): "8 GPUs",
    ("docs/recipes.md", "MODEL=llama3.1-8b LR=1e-6 bash recipes/eviomni_grpo.sh"): "8 GPUs",
    ("docs/recipes.md", "bash recipes/eviomni_grpo.sh trainer.total_epochs=2"): "8 GPUs",
    ("docs/evaluation.md", "SMOKE_STEPS=8"): "8 CPU training steps; the EviOmni smoke training runs in "
    "tests/conftest.py::eviomni_smoke_run",
    ("docs/debug-on-cpu.md", "LR=5e-5 bash recipes/evinote_grpo.sh --smoke"): "tests/recipes/test_slurm_job.py "
    "trains EviNote's smoke run (in the Slurm job, cancelled and requeued)",
}
# What a command's output must show besides its exit code 0 (what the doc says it does).
EXPECT: dict[tuple[str, str], str] = {
    ("docs/debug-on-cpu.md", "LR=5e-5 bash recipes/evinote_grpo.sh --smoke"): "actor_rollout_ref.actor.optim.lr=5e-5",
    ("docs/recipes.md", "MODEL=llama3.1-8b LR=1e-6"): "actor_rollout_ref.actor.optim.lr=1e-6",
    ("docs/quickstart.md", "curl -s -X POST"): '"result"',
    ("docs/quickstart.md", "verl-evidence version"): f"from {ROOT / 'verl_evidence'}",
}
# Documented commands that fail today because of a product bug outside these docs: {(page, command start): (bug, what
# its output shows)}. Such a command must fail, and for that reason (strict): when the bug is fixed, its entry goes.
KNOWN_BUGS: dict[tuple[str, str], tuple[str, str]] = {}

# Doc placeholder -> stand-in (str.replace, in this order); fields filled per page.
STAND_INS = (
    ("http://127.0.0.1:8000", "{url}"),  # the page's own server, else the session's (tests/conftest.py)
    ("http://retrieval-host:8000", "{url}"),
    ("http://node1:8000", "{url}"),
    ("--port 8000", "--port {port}"),  # a free port: 8000 may be taken on a shared machine
    ("intfloat/e5-base-v2", "{minilm}"),  # the packaged MiniLM stands for E5 (no hub here)
    ("Qwen/Qwen2.5-7B-Instruct", "{tokenizer}"),
    ("/models/qwen2.5-1.5b", "{tokenizer}"),
    ("microsoft/deberta-large-mnli", "{nli}"),
    ("/models/bge-reranker", "{reranker}"),
    ("BAAI/bge-reranker-v2-m3", "{reranker}"),
    ("Qwen/Qwen3-Embedding-0.6B", "{minilm}"),
    ("/data/", "{work}/data/"),
)
# Pages that start a server of their own: "http://127.0.0.1:8000" there is that server.
OWN_SERVER = ("docs/quickstart.md",)
# Pages whose commands use a running server over the bundled corpus: the session's (no start of their own).
SESSION_SERVER_PAGES = ("docs/data-preparation.md",)
READY_LINE = "retrieval server ready at"
COMMAND_TIMEOUT_S = 600


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def starts_with(self, start: str) -> bool:
        """Whether the command, its runs of spaces read as one, begins with ``start``."""
        return " ".join(self.text.split()).startswith(start)


def page_commands(page: str) -> list[Command]:
    """The page's shell commands in order: continuation lines joined, comment-only and blank lines dropped."""
    commands = []
    for block in code_blocks(ROOT / page):
        if block.language not in SHELL:
            continue
        lines = block.text.splitlines()
        index = 0
        while index < len(lines):
            first, text = index, lines[index]
            while text.endswith("\\") and index + 1 < len(lines):
                index += 1
                text = text[:-1].rstrip() + " " + lines[index].strip()
            index += 1
            if text.strip() and not text.strip().startswith("#"):
                commands.append(Command(page, block.line + 1 + first, text.strip()))
    return commands


def _entry(table: dict, command: Command):
    """The value of the one entry of ``table`` whose (page, start) names ``command``; None without one."""
    matches = [value for (page, start), value in table.items() if page == command.page and command.starts_with(start)]
    assert len(matches) <= 1, f"{command.where}: `{command.text}` matches several entries"
    return matches[0] if matches else None


def without_comment(text: str) -> str:
    return re.sub(r"\s+#[^'\"]*$", "", text)


def test_every_documented_command_is_run_or_skipped_with_a_reason() -> None:
    """Each shell command of the pages is planned; every plan entry still names a command (none goes stale)."""
    commands = [command for page in PAGES for command in page_commands(page)]
    assert len(commands) > 40, "too few commands: the parser is broken"
    for table in (SKIPPED, DRY_RUN, EXPECT, KNOWN_BUGS):
        for page, start in table:
            assert any(c.page == page and c.starts_with(start) for c in commands), f"stale entry {page}: {start}"
    for command in commands:
        assert not (_entry(SKIPPED, command) and _entry(DRY_RUN, command)), command.where
        if _entry(DRY_RUN, command):
            assert re.search(r"\bbash recipes/\S+\.sh\b", command.text), f"{command.where}: --dry-run is a recipe flag"
    gpu_runs = [
        c.where
        for c in commands
        if re.search(r"\bbash recipes/", c.text)
        and not re.search(r"--(smoke|dry-run|cfg)\b", c.text)
        and not (_entry(SKIPPED, c) or _entry(DRY_RUN, c))
    ]
    assert not gpu_runs, f"GPU trainings would run: list them in DRY_RUN: {gpu_runs}"


# ----------------------------------------------------------------------------------------------- stand-ins


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory, bundled_index_dir: Path) -> dict:
    """Input files of the real formats, and local models under hub names; shared by the pages (read only)."""
    from retrieval_server.config import packaged_minilm_path
    from verl_evidence import bundled
    from verl_evidence.local.tiny_models import overlap_nli_model, save_tiny_tokenizer, tiny_nli_model

    root = tmp_path_factory.mktemp("doc-stand-ins")
    data = root / "data"
    data.mkdir()
    shutil.copy(bundled.corpus_path(), data / "wiki-18.jsonl")
    manifest = json.loads((bundled_index_dir / "manifest.json").read_text())
    assert manifest["index"]["factory"] == "Flat" and manifest["index"]["metric"] == "inner_product"
    shutil.copy(bundled_index_dir / manifest["index"]["file"], data / "e5_Flat.index")  # IndexFlatIP, like Search-R1's
    questions = [json.loads(line) for line in bundled.qa_path().read_text().splitlines() if line.strip()]
    flashrag = [{k: q[k] for k in ("id", "question", "golden_answers")} for q in questions]
    files = {"nq_train": flashrag[:8], "nq_dev": flashrag[12:16], "nq/train": flashrag[:8], "nq/test": flashrag[8:12],
             "hotpotqa/train": flashrag[16:24], "hotpotqa/dev": flashrag[24:28]}  # fmt: skip
    for name, rows in files.items():
        (root / f"{name}.jsonl").parent.mkdir(exist_ok=True)
        (root / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    passages = {p["id"]: p["contents"] for p in map(json.loads, bundled.corpus_path().read_text().splitlines())}
    (root / "dpr_top5.jsonl").write_text(
        "".join(
            json.dumps({"id": q["id"], "passages": [{"id": i, "contents": passages[i]} for i in q["gold_passage_ids"]]})
            + "\n"
            for q in questions[12:16]
        )
    )
    from benchmark_scripts import load_benchmark

    search_r1 = load_benchmark("search_r1_files")
    HOTPOTQA_METADATA, write_search_r1_parquet = search_r1.HOTPOTQA_METADATA, search_r1.write_search_r1_parquet

    (root / "nq_hotpotqa_train").mkdir()  # Search-R1's merged files, of bundled questions (their answers are served)
    for split, first in (("train", 0), ("test", 40)):
        datasets = {"nq": flashrag[first : first + 6], "hotpotqa": flashrag[first + 6 : first + 12]}
        write_search_r1_parquet(root / "nq_hotpotqa_train" / f"{split}.parquet", datasets, split, HOTPOTQA_METADATA)
    (root / "hotpot_train_v1.1.json").write_text(json.dumps(hotpotqa_original(questions[:6], passages)))
    (root / "hotpot_dev_distractor_v1.json").write_text(json.dumps(hotpotqa_original(questions[6:10], passages)))
    (root / "qasper-train-v0.3.json").write_text(json.dumps(qasper_original(questions[:4], passages)))
    models = root / "models"
    return {
        "root": root,
        "minilm": str(packaged_minilm_path()),
        "tokenizer": str(save_tiny_tokenizer(models / "tokenizer")),
        "nli": str(overlap_nli_model(models / "nli")),
        "reranker": str(tiny_nli_model(models / "reranker", id2label={0: "relevance"})),  # one label: a cross-encoder
    }


def _sentences(contents: str) -> tuple[str, list[str]]:
    title, text = contents.split("\n", 1)
    return title, [sentence + "." for sentence in text.rstrip(".").split(". ")]


def hotpotqa_original(questions: list[dict], passages: dict[str, str]) -> list[dict]:
    """HotpotQA's own JSON list (``_id``, ``answer``, ``supporting_facts: [[title, sent_id]]``, ``context: [[title,
    [sentences]]]``): ten paragraphs a question, its gold ones and then distractors, as in the distractor setting."""
    ids = sorted(passages)
    rows = []
    for number, question in enumerate(questions):
        gold = question["gold_passage_ids"]
        others = [i for i in [*question["distractor_ids"], *ids[number * 10 :]] if i not in gold]
        context = [_sentences(passages[i]) for i in [*gold, *others][:10]]
        facts = [[_sentences(passages[i])[0], 0] for i in gold]
        rows.append(
            {
                "_id": question["id"],
                "question": question["question"],
                "answer": question["golden_answers"][0],
                "supporting_facts": facts,
                "context": [[title, sentences] for title, sentences in context],
            }
        )
    return rows


def qasper_original(questions: list[dict], passages: dict[str, str]) -> dict:
    """QASPER's own ``{paper_id: paper}`` JSON: one paper of twelve paragraphs a question, the gold one cited."""
    ids = sorted(passages)
    papers = {}
    for number, question in enumerate(questions):
        gold = passages[question["gold_passage_ids"][0]].split("\n", 1)[1]
        others = [passages[i].split("\n", 1)[1] for i in ids[number * 12 : number * 12 + 11]]
        answer = {
            "unanswerable": False,
            "extractive_spans": question["golden_answers"][:1],
            "yes_no": None,
            "free_form_answer": "",
            "evidence": [gold],
            "highlighted_evidence": question["gold_evidence"],
        }
        papers[f"paper{number}"] = {
            "title": f"Paper {number}",
            "abstract": "",
            "full_text": [{"section_name": "Body", "paragraphs": [gold, *others]}],
            "qas": [{"question": question["question"], "question_id": question["id"], "answers": [{"answer": answer}]}],
        }
    return papers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Process:
    """A command's shell in a process group of its own, and its output so far (read by a thread)."""

    command: Command
    process: subprocess.Popen
    output: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reader = threading.Thread(target=lambda: self.output.extend(self.process.stdout), daemon=True)
        self.reader.start()

    def text(self) -> str:
        return "".join(self.output)

    def stop(self, how: signal.Signals = signal.SIGTERM) -> None:
        """The command's process first (a server shuts its Serve and Ray down on SIGTERM), then what is left of its
        group."""
        if self.process.poll() is None:
            self.process.send_signal(how)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=90)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


@dataclass
class PageRun:
    page: str
    work: Path
    fields: dict[str, str]
    env: dict[str, str]
    background: list[Process] = field(default_factory=list)  # the servers it started
    seconds: dict[str, tuple[float, float]] = field(default_factory=dict)  # {where: (wall, CPU of its processes)}

    def shell(self, command: Command) -> str:
        text = command.text
        for placeholder, stand_in in STAND_INS:
            if placeholder in text:
                text = text.replace(placeholder, stand_in.format(**self.fields))
        if _entry(DRY_RUN, command):
            text = without_comment(text) + " --dry-run"
        return text

    def spawn(self, command: Command, text: str) -> Process:
        process = subprocess.Popen(
            ["bash", "-c", text], cwd=self.work, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        return Process(command, process)

    def start(self, command: Command, text: str, wait_ready: bool) -> None:
        server = self.spawn(command, text)
        self.background.append(server)
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while wait_ready and READY_LINE not in server.text():
            if server.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{command.where}: `{command.text}` never became ready:\n{server.text()[-4000:]}")
            time.sleep(0.5)

    def run(self, command: Command, text: str) -> subprocess.CompletedProcess:
        job = self.spawn(command, text)
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while job.process.poll() is None:
            dead = [b for b in self.background if b.process.poll() is not None]
            if dead or time.monotonic() > deadline:  # a wait on a server that died would never end
                job.stop(signal.SIGKILL)
                why = f"`{dead[0].command.text}` ({dead[0].command.where}) exited" if dead else "timed out"
                detail = dead[0].text()[-4000:] if dead else ""
                pytest.fail(f"{command.where}: `{command.text}`: {why}:\n{detail}{job.text()[-2000:]}")
            time.sleep(0.2)
        job.reader.join(timeout=10)
        return subprocess.CompletedProcess(text, job.process.returncode, job.text())


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def page_env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "120"}
    env.pop("RAY_ADDRESS", None)  # a server or trainer a page starts has its own Ray, as for a user
    return env


def serves(text: str) -> bool:
    return bool(re.match(r"^(verl-evidence|retrieval-server) serve\b", text))


def run_page(page: str, stand_ins: dict, tmp_path: Path, session_url: str | None) -> PageRun:
    """Run the page's commands in order; fail at the first that exits non-zero (known bugs: must fail)."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    for entry in stand_ins["root"].iterdir():
        (work / entry.name).symlink_to(entry)
    (work / "recipes").symlink_to(ROOT / "recipes")
    port = free_port()
    url = f"http://127.0.0.1:{port}" if page in OWN_SERVER else session_url
    fields = {**{k: v for k, v in stand_ins.items() if k != "root"}, "work": str(work), "port": str(port), "url": url}
    run = PageRun(page, work, fields, page_env())
    known_failures = []
    try:
        for command in page_commands(page):
            if _entry(SKIPPED, command):
                continue
            text = run.shell(command)
            started, cpu = time.monotonic(), _children_cpu()
            if text.endswith("&") or serves(text):  # a server: left running (a user's other terminal)
                if serves(text) and "--port" not in text:
                    text = text.rstrip("& ") + f" --port {port}"
                run.start(command, text.rstrip("& "), wait_ready=not text.endswith("&"))
                run.seconds[command.where] = (time.monotonic() - started, 0.0)  # its CPU: counted when it stops
                continue
            result = run.run(command, text)
            run.seconds[command.where] = (time.monotonic() - started, _children_cpu() - cpu)
            if known := _entry(KNOWN_BUGS, command):
                bug, symptom = known
                where = f"{command.where}: `{command.text}`"
                assert result.returncode != 0, f"{where} works now: remove KNOWN_BUGS' {bug!r}"
                assert symptom in result.stdout, f"{where} fails, not with {symptom!r}:\n{result.stdout[-3000:]}"
                known_failures.append(f"{command.where}: {bug}")
                continue
            assert result.returncode == 0, (
                f"{command.where}: `{command.text}` exited {result.returncode}\n(ran: {text})\n{result.stdout[-5000:]}"
            )
            expected = _entry(EXPECT, command)
            assert expected is None or expected in result.stdout, (
                f"{command.where}: `{command.text}` did not show {expected!r}:\n{result.stdout[-3000:]}"
            )
    finally:
        cpu = _children_cpu()
        for server in run.background:
            server.stop()
        run.seconds["servers"] = (0.0, _children_cpu() - cpu)
        print(f"{page} (wall/CPU s): " + ", ".join(f"{w} {a:.1f}/{c:.1f}" for w, (a, c) in run.seconds.items()))
    if known_failures:
        pytest.xfail("; ".join(known_failures))
    return run


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("page", [p for p in PAGES if p not in SESSION_SERVER_PAGES])
def test_page_runs_with_its_own_server_or_none(page: str, stand_ins: dict, tmp_path: Path) -> None:
    """Pages whose commands need no server, or start their own (stopped when the page ends)."""
    run_page(page, stand_ins, tmp_path, session_url=None)


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("page", SESSION_SERVER_PAGES)
def test_page_runs_against_the_session_server(page: str, stand_ins: dict, tmp_path: Path, retrieval_server_url) -> None:
    """Pages whose commands use a running server over the bundled corpus: the session's (tests/conftest.py)."""
    run_page(page, stand_ins, tmp_path, session_url=retrieval_server_url)


@pytest.mark.parametrize("argument", ["LR=5e-5", "+LR=5e-5", "++LR=5e-5"])
def test_a_recipe_variable_after_the_recipe_is_refused(argument: str) -> None:
    """`--smoke LR=5e-5` (docs/debug-on-cpu.md once said so): Hydra refused it, and `+LR=5e-5` trained at the default
    rate without a word. Now both stop before anything runs, saying how to set it; set before the command, it
    reaches the trainer."""
    refused = subprocess.run(
        ["bash", "recipes/evinote_grpo.sh", "--dry-run", argument], cwd=ROOT, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "# trainer:" not in refused.stdout, refused.stdout + refused.stderr
    assert f"error: {argument} is a recipe variable, not a Hydra override" in refused.stderr
    assert "LR=5e-5 bash recipes/evinote_grpo.sh" in refused.stderr
    taken = subprocess.run(
        ["bash", "recipes/evinote_grpo.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "LR": "5e-5"},
    )  # fmt: skip
    assert taken.returncode == 0 and "actor_rollout_ref.actor.optim.lr=5e-5" in taken.stdout, taken.stderr


def test_the_runner_names_page_line_and_command_of_a_failure(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```bash\ntrue\nfalse \\\n    --flag   # fails\n```\n")
    (tmp_path / "inputs").mkdir()
    with pytest.raises(AssertionError, match=rf"{page}:5: `false --flag +# fails` exited 1"):
        run_page(str(page), {"root": tmp_path / "inputs"}, tmp_path, session_url=None)


def test_a_server_that_exits_stops_the_command_waiting_for_it(tmp_path: Path) -> None:
    """A wait on a dead server (`until curl ...`) would never end: it is stopped, naming the server's command."""
    page = tmp_path / "page.md"
    page.write_text("```bash\necho starting; exit 3 &\nuntil false; do sleep 1; done\n```\n")
    (tmp_path / "inputs").mkdir()
    with pytest.raises(pytest.fail.Exception, match=r"page.md:3: `until false.*`echo starting; exit 3 &`.*exited"):
        run_page(str(page), {"root": tmp_path / "inputs"}, tmp_path, session_url=None)


def test_a_known_bug_must_fail_with_its_symptom(tmp_path: Path, monkeypatch) -> None:
    page = tmp_path / "page.md"
    page.write_text("```bash\nls no-such-file\n```\n")
    (tmp_path / "inputs").mkdir()
    monkeypatch.setitem(KNOWN_BUGS, (str(page), "ls no-such-file"), ("bug 1", "No such file"))
    with pytest.raises(pytest.xfail.Exception, match="page.md:2: bug 1"):
        run_page(str(page), {"root": tmp_path / "inputs"}, tmp_path / "a", session_url=None)
    monkeypatch.setitem(KNOWN_BUGS, (str(page), "ls no-such-file"), ("bug 1", "Permission denied"))
    with pytest.raises(AssertionError, match="fails, not with 'Permission denied'"):
        run_page(str(page), {"root": tmp_path / "inputs"}, tmp_path / "b", session_url=None)
    page.write_text("```bash\nls no-such-file || true\n```\n")
    with pytest.raises(AssertionError, match="works now: remove KNOWN_BUGS' 'bug 1'"):
        run_page(str(page), {"root": tmp_path / "inputs"}, tmp_path / "c", session_url=None)
