"""Every subcommand of both command lines, given wrong files, missing fields, impossible settings and models that are
not there, ends in one message naming the option or file (and exit code 2), never in a traceback.

The subcommands are read from the typer apps themselves: a new one fails
``test_every_subcommand_has_its_bad_input_cases`` until its cases are written here, and meanwhile gets the cases
every command gets (an unknown option; every path it takes missing). In-process through typer's ``CliRunner``: a
command that raised a bug would leave its exception in ``result.exception`` (the traceback a user would see).
"""

from __future__ import annotations

import logging
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from retrieval_server.cli import app as server_app
from verl_evidence.cli import app as cli_app

APPS = {"verl-evidence": cli_app, "retrieval-server": server_app}
# Commands that import verl (the evaluation session) before they read their options: the slow tier.
IMPORTS_VERL = {("eval",), ("demo",)}
HUB_MODEL = "intfloat/e5-base-v2"  # not on this machine (the suite runs offline)


def leaf_commands(command, path: tuple[str, ...] = ()):
    """(path, command) of every runnable command under a click group (typer's own click: duck-typed)."""
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from leaf_commands(sub, (*path, name))
    else:
        yield path, command


def every_command() -> list[tuple[str, tuple[str, ...], Any]]:
    return [
        (prog, path, command)
        for prog, app in APPS.items()
        for path, command in leaf_commands(typer.main.get_command(app))
    ]


def key(prog: str, path: tuple[str, ...]) -> tuple[str, ...]:
    """retrieval-server's build/recall/... are verl-evidence's index build/recall/...: one set of cases for both."""
    return path if prog == "verl-evidence" or path == ("serve",) else ("index", *path)


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]  # {tmp}, {missing}, {bad_json}, {wrong_qa}, {corpus}, {text}, {minilm} filled in
    named: tuple[str, ...]  # in the message (filled in the same way)
    progs: tuple[str, ...] = ("verl-evidence", "retrieval-server")
    slow: bool = False  # imports torch or transformers first


def case(*args: str, named: tuple[str, ...], progs: tuple[str, ...] = tuple(APPS), slow: bool = False) -> Case:
    return Case(args, named, progs, slow)


OFFLINE_MODEL = ("not on this machine", "HF_HUB_OFFLINE is set", "pass a local directory", "HF_HOME")

CASES: dict[tuple[str, ...], list[Case]] = {
    ("version",): [case("extra", named=("unexpected extra argument",))],
    ("serve",): [
        case("--index-dir", "{missing}", named=("no index manifest at {missing}/manifest.json", "index build")),
        case("--index-dir", "{missing}", "--token-file", "{missing}/token", named=("--token-file",)),
        case("--index-dir", "{missing}", "--model", HUB_MODEL, named=(f"--model {HUB_MODEL}", *OFFLINE_MODEL)),
        case("--index-dir", "{missing}", "--replica-resource", "gpu", named=("--replica-resource", "NAME=AMOUNT")),
        case("--index-dir", "{missing}", "--method", "foo", named=("method='foo'", "'dense', 'bm25' or 'hybrid'")),
    ],
    ("index", "build"): [
        case("--corpus", "{bad_json}", "-o", "{tmp}/b1", named=("{bad_json}:1",)),
        case("--corpus", "{missing}/c.jsonl", "-o", "{tmp}/b2", named=("{missing}/c.jsonl",)),
        case("--corpus", "{corpus}", "-o", "{tmp}/b3", "--model", HUB_MODEL, named=("--model", *OFFLINE_MODEL)),
        case(
            "--corpus",
            "{corpus}",
            "-o",
            "{tmp}/b4",
            "--device",
            "gpu0",
            named=("--device gpu0: not a torch device",),
            slow=True,
        ),  # fmt: skip
        case(
            "--corpus",
            "{corpus}",
            "-o",
            "{tmp}/b5",
            "--device",
            "cuda:3",
            named=("--device cuda:3: this machine has", "pass --device cpu"),
            slow=True,
        ),  # fmt: skip
        # encoder settings without --model were silently not applied (the index built with the packaged defaults)
        case(
            "--corpus",
            "{corpus}",
            "-o",
            "{tmp}/b6",
            "--pooling",
            "cls",
            "--max-length",
            "64",
            named=("--pooling, --max-length: these set the encoder given with --model",),
        ),  # fmt: skip
    ],
    ("index", "recall"): [  # the QA file is read before the index is looked at
        case("--qa", "{wrong_qa}", "--index-dir", "{missing}", named=("gold_passage_ids", "'gold_ids'", "rename")),
        case("--qa", "{missing}/qa.jsonl", "--index-dir", "{missing}", named=("{missing}/qa.jsonl: no such file",)),
    ],
    ("index", "adopt"): [
        case(
            "--index",
            "{text}",
            "--corpus",
            "{corpus}",
            "-o",
            "{tmp}/a1",
            "--model",
            "{minilm}",
            named=("{text} does not start with a FAISS index header",),
        ),  # fmt: skip
        case(
            "--index",
            "{missing}/x.index",
            "--corpus",
            "{corpus}",
            "-o",
            "{tmp}/a2",
            "--model",
            HUB_MODEL,
            named=(f"--model {HUB_MODEL}", *OFFLINE_MODEL),
        ),  # fmt: skip
    ],
    ("index", "convert"): [
        case("--index-dir", "{missing}", "-o", "{tmp}/c1", "--to", "fp16", named=("no index manifest",)),
    ],
    ("index", "verify"): [case("--index-dir", "{missing}", named=("no index manifest at {missing}",))],
    ("data", "qa"): [
        case("{bad_json}", "-o", "{tmp}/q.parquet", "--data-source", "nq", named=("{bad_json}:1: not valid JSON",)),
        case("{corpus}", "-o", "{tmp}/q.parquet", "--data-source", "nq", named=("missing column(s) question",)),
    ],
    ("data", "eviomni"): [
        case(
            "bundled",
            "-o",
            "{tmp}/e.parquet",
            "--tokenizer",
            HUB_MODEL,
            "--passages-file",
            "{missing}/p.jsonl",
            named=(f"--tokenizer {HUB_MODEL}", *OFFLINE_MODEL),
        ),  # fmt: skip
        case("bundled", "-o", "{tmp}/e.parquet", "--tokenizer", "{minilm}", named=("exactly one of",)),
        case(
            "bundled",
            "-o",
            "{tmp}/e.parquet",
            "--tokenizer",
            "{tmp}",
            "--passages-file",
            "{missing}/p.jsonl",
            named=("--tokenizer {tmp}: cannot load a tokenizer from it", "pass the policy's model directory"),
            slow=True,
        ),  # fmt: skip
        case(
            "bundled",
            "-o",
            "{tmp}/e.parquet",
            "--tokenizer",
            "{minilm}",
            "--retrieval-url",
            "http://127.0.0.1:9",
            named=("--retrieval-url http://127.0.0.1:9 does not answer", "verl-evidence serve"),
        ),  # fmt: skip
        case(
            "bundled",
            "-o",
            "{tmp}/e.parquet",
            "--tokenizer",
            "{minilm}",
            "--passages-file",
            "{corpus}",
            "--topk",
            "0",
            named=("--topk", "must be 1 or more"),
        ),  # fmt: skip
    ],
    ("data", "grace"): [
        case("{wrong_qa}", "-o", "{tmp}/g.parquet", named=("--corpus",)),
        case("{wrong_qa}", "-o", "{tmp}/g.parquet", "--style", "qa", named=("--data-source",)),
        case("bundled", "-o", "{tmp}/g.parquet", "--cross-encoder", HUB_MODEL, named=("--cross-encoder",)),
        case(
            "bundled",
            "-o",
            "{tmp}/g.parquet",
            "--retriever",
            "dense=http://127.0.0.1:9",
            named=("--retriever dense: http://127.0.0.1:9 does not answer",),
        ),  # fmt: skip
        case(
            "bundled", "-o", "{tmp}/g.parquet", "--k", "0", named=("--k", "must be 1 or more, got 0")
        ),  # was after encoding
    ],
    ("data", "inspect"): [
        case("{text}", named=("{text}: not a parquet file",)),
        case("{missing}/r.parquet", named=("{missing}/r.parquet: no such file",)),
    ],
    ("evipath", "synthesize"): [
        case("--input", "{bad_json}", "--model", "m", named=("{bad_json}:1: not valid JSON",)),
        case("--model", "m", "--encoder", HUB_MODEL, named=(f"--encoder {HUB_MODEL}", *OFFLINE_MODEL)),
        case(
            "--model",
            "m",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--out",
            "{tmp}/ev",
            "--limit",
            "1",
            named=("--base-url http://127.0.0.1:9/v1 does not answer", "start the OpenAI-compatible server"),
        ),  # fmt: skip
        case(
            "--model",
            "m",
            "--encoder-device",
            "cuda:3",
            named=("--encoder-device cuda:3: this machine has",),
            slow=True,
        ),  # fmt: skip
    ],
    ("smoke", "prepare"): [
        case("bogus", named=("'bogus' is not one of",)),
        case("eviomni", "--warmup", "bogus", named=("--warmup", "'bogus' is not a warm-up of eviomni")),
        # another family's warm-up (was "unknown warm-up 'search'; one of ..., search, ...")
        case("lear", "--warmup", "search", named=("'search' is not a warm-up of lear", "'eviomni' family's format")),
        case("evipath_sft", "--warmup", "search", named=("evipath_sft trains an untrained policy: no warm-up",)),
    ],
    ("eval",): [
        case("--data", "{bad_json}", "--out", "{tmp}/ev", named=("{bad_json}:1: not valid JSON",)),
        case("--nli-model", HUB_MODEL, "--out", "{tmp}/ev", named=(f"--nli-model {HUB_MODEL}", *OFFLINE_MODEL)),
        case(
            "--model", "{missing}/policy", "--out", "{tmp}/ev", named=("--model {missing}/policy is not a directory",)
        ),
        case(
            "--retrieval-url",
            "http://127.0.0.1:9",
            "--out",
            "{tmp}/ev",
            named=("--retrieval-url http://127.0.0.1:9 does not answer", "verl-evidence serve"),
        ),  # fmt: skip
        case(
            "--endpoint",
            "http://127.0.0.1:9/v1",
            "--served-model",
            "m",
            "--tokenizer",
            "{minilm}",
            "--out",
            "{tmp}/ev",
            named=("--endpoint http://127.0.0.1:9/v1 does not answer", "start the OpenAI-compatible server"),
        ),  # fmt: skip
        case(
            "--endpoint",
            "http://127.0.0.1:9/v1",
            "--served-model",
            "m",
            "--tokenizer",
            "{missing}/tok",
            named=("--tokenizer {missing}/tok: no such directory",),
        ),  # fmt: skip
        case("--nli-device", "cuda:3", "--out", "{tmp}/ev", named=("--nli-device cuda:3: this machine has",)),
    ],
    ("demo",): [
        case("--trajectories", "{missing}/t.jsonl", named=("--trajectories {missing}/t.jsonl is not a file",)),
        case("--nli-model", HUB_MODEL, "--out", "{tmp}/demo", named=(f"--nli-model {HUB_MODEL}", *OFFLINE_MODEL)),
        case(
            "--retrieval-url",
            "http://127.0.0.1:9",
            "--out",
            "{tmp}/demo",
            named=("--retrieval-url http://127.0.0.1:9 does not answer",),
        ),  # fmt: skip
    ],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The wrong inputs: a file that is not JSON, a QA set whose gold field is named differently, a corpus, a text
    file where a parquet or FAISS file belongs, a directory that does not exist."""
    from retrieval_server.config import packaged_minilm_encoder

    tmp = tmp_path_factory.mktemp("bad_input")
    (tmp / "bad.jsonl").write_text("not json\n")
    (tmp / "qa.jsonl").write_text('{"id": "q1", "question": "Where?", "golden_answers": ["x"], "gold_ids": ["a"]}\n')
    (tmp / "corpus.jsonl").write_text('{"id": "a", "contents": "A\\ntext"}\n')
    (tmp / "text.txt").write_text("hello\n")
    return {
        "tmp": str(tmp), "missing": str(tmp / "missing"), "bad_json": str(tmp / "bad.jsonl"),
        "wrong_qa": str(tmp / "qa.jsonl"), "corpus": str(tmp / "corpus.jsonl"), "text": str(tmp / "text.txt"),
        "minilm": packaged_minilm_encoder().model,
    }  # fmt: skip


@pytest.fixture(autouse=True)
def offline_and_fresh_logging(monkeypatch):
    """Offline as the suite is; and the root logger's handlers as they were (a command's logging.basicConfig would
    otherwise write the next command's log lines to this one's closed output)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    handlers = list(logging.getLogger().handlers)
    yield
    logging.getLogger().handlers[:] = handlers


def refusal(prog: str, args: list[str]) -> str:
    """The command's output, after checking it is a refusal: exit code 2, no exception left over, the last line an
    ``error:`` (ours) or ``Error:`` (click's usage error) line."""
    result = CliRunner().invoke(APPS[prog], args)
    shown = f"{prog} {' '.join(args)}\n{result.output}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback instead of a refusal: {shown}") from result.exception
    assert result.exit_code == 2, shown
    assert "Traceback" not in result.output, shown
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(("error: ", "Error: ")), shown
    return result.output


def params(slow: bool) -> list:
    found = []
    for prog, path, _ in every_command():
        for number, each in enumerate(CASES.get(key(prog, path), [])):
            if prog in each.progs and (path in IMPORTS_VERL or each.slow) == slow:
                found.append(pytest.param(prog, path, each, id=f"{prog} {' '.join(path)} #{number + 1}"))
    return found


def check(prog: str, path: tuple[str, ...], each: Case, files: dict[str, str]) -> None:
    output = refusal(prog, [*path, *(arg.format(**files) for arg in each.args)])
    flat = " ".join(output.split())  # click wraps its usage errors
    for named in each.named:
        assert named.format(**files) in flat, output


def test_every_subcommand_has_its_bad_input_cases() -> None:
    commands = every_command()
    assert len(commands) >= 21, commands  # what there is today: a walk that finds fewer is broken
    uncovered = sorted({" ".join([prog, *path]) for prog, path, _ in commands if not CASES.get(key(prog, path))})
    assert uncovered == [], f"write bad-input cases for {uncovered} in CASES"
    unknown = sorted(set(CASES) - {key(prog, path) for prog, path, _ in commands})
    assert unknown == [], f"cases for commands that do not exist: {unknown}"


@pytest.mark.parametrize(("prog", "path", "each"), params(slow=False))
def test_bad_input_is_refused_in_one_line_naming_it(prog, path, each, files) -> None:
    check(prog, path, each, files)


@pytest.mark.slow  # eval and demo import verl (the evaluation session) before their checks; others transformers
@pytest.mark.parametrize(("prog", "path", "each"), params(slow=True))
def test_bad_input_to_heavy_commands_is_refused_in_one_line_naming_it(prog, path, each, files) -> None:
    check(prog, path, each, files)


def takes_path(param) -> bool:
    annotation = param.type_descriptor.annotation
    return annotation is Path or Path in typing.get_args(annotation)


def generic_cases() -> list:
    """Every command, also one added tomorrow: an option it does not have, and every path it takes missing."""
    found = []
    for prog, path, command in every_command():
        marks = [pytest.mark.slow] if path in IMPORTS_VERL else []
        name = f"{prog} {' '.join(path)}"
        found.append(pytest.param(prog, path, ["--no-such-option"], marks=marks, id=f"{name} unknown option"))
        args = []
        for param in command.params:
            if takes_path(param):
                value = "{missing}/" + param.name
            elif param.required:
                value = "x"
            else:
                continue
            if param.param_type_name == "option":
                args += [param.opts[0], value]
            else:
                args.append(value)
        if any("{missing}" in arg for arg in args):
            found.append(pytest.param(prog, path, args, marks=marks, id=f"{name} missing paths"))
    return found


@pytest.mark.parametrize(("prog", "path", "args"), generic_cases())
def test_every_command_refuses_an_unknown_option_and_missing_paths(prog, path, args, files) -> None:
    """(Required values that are not paths are given as "x": what a command refuses first is its choice.)"""
    refusal(prog, [*path, *(arg.format(**files) for arg in args)])


def test_an_unreachable_hub_is_one_line_naming_the_model_and_the_way_out(monkeypatch, files) -> None:
    """Online, but the hub does not answer: one request (no retries for 30 s), then the model, the hub and the fix."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    args = ["index", "build", "--corpus", files["corpus"], "-o", f"{files['tmp']}/hub", "--model", HUB_MODEL]
    output = refusal("verl-evidence", args)
    line = output.strip().splitlines()[-1]
    assert line.startswith(f"error: --model {HUB_MODEL}: not on this machine"), line
    assert "http://127.0.0.1:9 is unreachable" in line and "pass a local directory" in line, line
    assert len(output.strip().splitlines()) == 1, output


@pytest.mark.slow  # loads the packaged MiniLM (torch): the factory is checked against its dimension
def test_an_index_faiss_cannot_train_on_the_corpus_is_refused_before_encoding(tmp_path: Path) -> None:
    """The bundled corpus has 322 passages: IVF4096 needs 4096 training vectors. Refused before any passage is
    encoded (faiss said so only when it trained, after the encoding), with lists the corpus can train."""
    out = tmp_path / "index"
    output = refusal("verl-evidence", ["index", "build", "--factory", "IVF4096,PQ96", "-o", str(out)])
    line = output.strip().splitlines()[-1]
    assert "index factory 'IVF4096,PQ96' (--factory) trains 4096 IVF lists" in line, line
    assert "322 passages" in line and "IVF8,Flat" in line, line
    assert not (out / "shards").exists() or not any((out / "shards").iterdir())  # nothing encoded
    output = refusal("verl-evidence", ["index", "build", "--factory", "IVF16,PQ97", "-o", str(out)])
    assert "faiss cannot make it for the encoder's 384-d vectors" in output and "IVF4096,PQ48" in output, output


def test_the_factory_check_reads_what_faiss_would_train() -> None:
    """Without an encoder: the lists and centroids of several factories, and the fix each refusal names."""
    import faiss

    from retrieval_server.factory_check import IndexFactoryError, check_factory, training_needs

    def needs(factory: str) -> dict[str, int]:
        return training_needs(faiss.index_factory(64, factory, faiss.METRIC_INNER_PRODUCT))

    assert needs("IVF4096,PQ16") == {"IVF lists": 4096, "PQ centroids": 256}
    assert needs("OPQ8,IVF64,PQ8") == {"OPQ centroids": 256, "IVF lists": 64, "PQ centroids": 256}
    assert needs("HNSW32,PQ16") == {"PQ centroids": 256} and needs("PQ16x4") == {"PQ centroids": 16}
    assert needs("IVF64_HNSW32,Flat") == {"IVF lists": 64} and needs("SQ8") == {}
    check_factory("IVF64,Flat", 64, passages=64, train_sample=1000)  # one vector per list: faiss trains it
    check_factory("HNSW32,Flat", 64, passages=1, train_sample=1)  # nothing to train
    with pytest.raises(IndexFactoryError, match=r"raise --train-sample to at least 256 "):
        check_factory("IVF64,PQ16", 64, passages=10_000, train_sample=100)
    with pytest.raises(IndexFactoryError, match=r"could not parse index string Bogus"):
        check_factory("Bogus", 64, passages=10, train_sample=10)


def test_the_hub_check_passes_local_directories_and_cached_models(tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import constants

    from retrieval_server.user_errors import model_source_problem

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_source_problem(str(tmp_path), "--model") is None
    assert "no such directory" in model_source_problem(str(tmp_path / "gone"), "--model")
    cache = tmp_path / "hub"
    (cache / "models--org--name" / "snapshots" / "abc").mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert model_source_problem("org/name", "--model") is None
    assert "HF_HUB_OFFLINE is set" in model_source_problem("org/other", "--model")
    assert os.environ["HF_HUB_OFFLINE"] == "1"


@pytest.mark.slow  # the installed console scripts, in processes of their own
def test_the_installed_commands_print_the_refusal_alone(files) -> None:
    """Where the process matters: the hub settings read at start-up (not offline, the hub unreachable), the logging
    set up by the commands, typer's exception hook. stderr is the one line, exit code 2."""
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    scripts = Path(sys.executable).parent
    runs = {
        "verl-evidence": [
            "index",
            "build",
            "--corpus",
            files["corpus"],
            "-o",
            f"{files['tmp']}/p1",
            "--model",
            HUB_MODEL,
        ],
        "retrieval-server": ["recall", "--qa", files["wrong_qa"], "--index-dir", files["missing"]],
    }
    for script, args in runs.items():
        done = subprocess.run(
            [str(scripts / script), *args], capture_output=True, text=True, timeout=300, check=False, env=env
        )
        assert done.returncode == 2 and done.stdout == "", (script, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), (script, done.stderr)
        assert HUB_MODEL in done.stderr or "gold_passage_ids" in done.stderr, done.stderr
