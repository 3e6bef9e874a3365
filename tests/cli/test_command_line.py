"""The first minute at the command line: ``--help`` imports no heavy library, and an error a user can cause
(missing or mismatched index, bad corpus line, model path not found, port taken, unreadable data file) is one
``error:`` line naming the file or value, with exit code 2; ``--debug`` and bugs keep the traceback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from retrieval_server.cli import app as server_app
from retrieval_server.user_errors import SERVER_USER_ERRORS, boundary_group, debug_option
from verl_evidence.cli import USER_ERRORS
from verl_evidence.cli import app as cli_app

# Libraries that cost seconds to import on a small machine; no --help may load one.
HEAVY = (
    "verl", "torch", "ray", "transformers", "pandas", "faiss", "nltk", "scipy",
    "numpy", "pyarrow", "matplotlib", "sentence_transformers",
)  # fmt: skip

EVERY_HELP = """
import contextlib, io, json, sys
import typer.main
from retrieval_server.cli import app as server_app
from verl_evidence.cli import app as cli_app

def command_paths(command, path=()):
    yield list(path)
    for name, sub in getattr(command, "commands", {}).items():
        yield from command_paths(sub, (*path, name))

shown, cut, widest = [], {}, {}
for prog, app in (("verl-evidence", cli_app), ("retrieval-server", server_app)):
    root = typer.main.get_command(app)
    for path in command_paths(root):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                root.main([*path, "--help"], prog_name=prog)
            except SystemExit as done:
                assert done.code == 0, (path, done.code)
        assert "Usage:" in out.getvalue(), (path, out.getvalue())
        shown.append(" ".join([prog, *path]))
        command = root
        for name in path:
            command = command.commands[name]
        words = set(out.getvalue().replace("/", " ").replace(",", " ").split())
        options = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts] if "-" in opt[:1]}
        cut[" ".join([prog, *path])] = sorted(options - words)  # an option name not shown whole as one word
        widest[" ".join([prog, *path])] = max(len(line) for line in out.getvalue().splitlines())
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[1:]))
print(json.dumps({"shown": shown, "heavy": heavy, "cut": cut, "widest": widest}))
"""


@pytest.fixture(scope="module")
def every_help() -> dict:
    """``--help`` of both tools and of every (sub)command, in one fresh interpreter on an 80-column terminal."""
    done = subprocess.run(
        [sys.executable, "-c", EVERY_HELP, *HEAVY],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "COLUMNS": "80", "LINES": "24"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_help_imports_no_heavy_library(every_help: dict) -> None:
    """Not one heavy module loaded by all the ``--help`` pages together."""
    result = every_help
    expected = {"verl-evidence", "verl-evidence serve", "verl-evidence data qa", "verl-evidence index build",
                "verl-evidence eval", "verl-evidence demo", "verl-evidence evipath synthesize",
                "verl-evidence smoke prepare", "retrieval-server serve", "retrieval-server adopt"}  # fmt: skip
    assert expected <= set(result["shown"]), result["shown"]
    assert result["heavy"] == [], f"--help imported {result['heavy']}: import them inside the command that uses them"


def test_every_help_shows_every_option_name_whole_at_80_columns(every_help: dict) -> None:
    """A login node's terminal or a Slurm log: no option name cut (rich's option table ended them in '…')."""
    assert len(every_help["cut"]) == len(every_help["shown"]) > 20
    assert {command: cut for command, cut in every_help["cut"].items() if cut} == {}
    assert max(every_help["widest"].values()) <= 80, every_help["widest"]


def run(app: typer.Typer, *args: str):
    return CliRunner().invoke(app, list(args))


def one_error_line(result) -> str:
    """The output of a command that failed with a user error: exactly one line, ``error: ...``; exit code 2."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize("app", [cli_app, server_app], ids=["verl-evidence", "retrieval-server"])
def test_missing_index_is_one_line_naming_the_manifest_and_the_fix(app, tmp_path: Path) -> None:
    missing = tmp_path / "no-index"
    line = one_error_line(run(app, "serve", "--index-dir", str(missing)))
    manifest = missing / "manifest.json"
    assert line == f"error: no index manifest at {manifest}: build the index first (verl-evidence index build)"


def test_a_server_setting_pydantic_refuses_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    """Checked before any index is looked at or built: the option's value and what it may be."""
    result = run(cli_app, "serve", "--index-dir", str(tmp_path / "no-index"), "--method", "foo")
    assert result.exit_code == 2, result.output
    assert "Invalid value: --method='foo': Input should be 'dense', 'bm25' or 'hybrid'" in result.output
    assert "Traceback" not in result.output and "manifest" not in result.output


def test_an_unknown_smoke_method_is_a_usage_error_naming_the_choices() -> None:
    result = run(cli_app, "smoke", "prepare", "foo")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "Invalid value for METHOD: 'foo' is not one of eviomni, lear" in result.output


def test_debug_shows_the_traceback_of_a_user_error(tmp_path: Path) -> None:
    from retrieval_server.index import IndexMismatchError

    result = run(cli_app, "--debug", "serve", "--index-dir", str(tmp_path / "no-index"))
    assert isinstance(result.exception, IndexMismatchError) and result.exit_code == 1


def test_bad_corpus_line_names_file_and_line(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "contents": "A\\ntext"}\nnot json\n')
    line = one_error_line(run(cli_app, "index", "build", "--corpus", str(corpus), "-o", str(tmp_path / "index")))
    assert line.startswith(f'error: {corpus}:2: expected {{"id", "contents"}} JSON')


def test_unreadable_data_files_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "qa.jsonl"
    line = one_error_line(run(cli_app, "data", "qa", str(missing), "-o", str(tmp_path / "rows.parquet"),
                              "--data-source", "nq"))  # fmt: skip
    assert line == f"error: {missing}: no such file"
    # A directory given as the corpus: the OSError (IsADirectoryError) is the user's, named by its path.
    folder = tmp_path / "corpus.jsonl"
    folder.mkdir()
    line = one_error_line(run(cli_app, "index", "build", "--corpus", str(folder), "-o", str(tmp_path / "index")))
    assert line == f"error: {folder}: Is a directory"


def test_a_bug_keeps_its_traceback_and_only_listed_classes_are_user_errors() -> None:
    """The boundary itself, on a two-command app: a listed class is one line, anything else propagates."""
    from retrieval_server.docstore import CorpusFormatError

    app = typer.Typer(cls=boundary_group(SERVER_USER_ERRORS), callback=debug_option)

    @app.command()
    def user() -> None:
        raise CorpusFormatError("corpus.jsonl:3: 'contents' must be a string")

    @app.command()
    def bug() -> None:
        raise KeyError("contents")

    assert one_error_line(run(app, "user")) == "error: corpus.jsonl:3: 'contents' must be a string"
    result = run(app, "bug")
    assert isinstance(result.exception, KeyError) and result.exit_code == 1


@pytest.mark.slow  # imports verl (through the reward managers' package)
def test_every_listed_user_error_is_an_exception_class() -> None:
    import importlib

    for name in USER_ERRORS:
        module, _, cls = name.partition(":")
        found = getattr(importlib.import_module(module), cls)
        assert isinstance(found, type) and issubclass(found, Exception), name


@pytest.mark.slow  # builds the bundled index on first use
def test_mismatched_index_names_corpus_and_model(bundled_index_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text('{"id": "a", "contents": "A\\ntext"}\n')
    result = run(cli_app, "serve", "--index-dir", str(bundled_index_dir), "--corpus", str(other))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.output.startswith("error: refusing to serve this index:")
    assert f"corpus {other} has changed or is a different file" in result.output
    missing_model = tmp_path / "no-model"
    result = run(cli_app, "serve", "--index-dir", str(bundled_index_dir), "--model", str(missing_model))
    # a model that is not there is named as such before the index is read (tests/cli/test_every_command_refuses.py)
    assert result.exit_code == 2 and f"--model {missing_model}: no such directory" in result.output


@pytest.mark.slow  # loads sentence-transformers (torch)
def test_model_path_not_found_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "contents": "A\\ntext"}\n')
    args = ("index", "build", "--corpus", str(corpus), "--model", str(missing), "-o", str(tmp_path / "index"))
    assert str(missing) in one_error_line(run(cli_app, *args))


@pytest.mark.slow  # runs the installed CLI in a subprocess
def test_port_taken_and_missing_index_through_the_installed_command(bundled_index_dir: Path, tmp_path: Path) -> None:
    """The real entry point (typer's exception hook included): stderr is the one line, nothing else."""
    from retrieval_server.haproxy_front import haproxy_binary

    command = Path(sys.executable).parent / "verl-evidence"
    done = subprocess.run([command, "serve", "--index-dir", str(tmp_path / "none")], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: no index manifest")
    if haproxy_binary() is None:
        pytest.skip("no HAProxy binary: the proxy ingress would start Ray before binding the port")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [command, "serve", "--index-dir", str(bundled_index_dir), "--port", str(port), "--ingress", "haproxy"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "│" not in done.stderr, done.stderr  # no plain or rich traceback
    last = done.stderr.strip().splitlines()[-1]  # after the INFO lines of the libraries it loaded
    assert last == f"error: cannot serve on 127.0.0.1:{port}: Address already in use; choose another --port"


@pytest.mark.slow  # the recipe composes verl's Hydra config in a subprocess
@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.total_epoch=3", "Could not override 'trainer.total_epoch'. To append to your config use +trainer"),
        ("rollout_preset=serch", "Could not find 'rollout_preset/serch', Available options in 'rollout_preset': "),
        ("trainer.total_epochs=[", "cannot parse the override 'trainer.total_epochs=['"),
    ],
)
def test_bad_hydra_override_in_a_recipe_is_one_line(override: str, named: str) -> None:
    """The recipe's pre-flight step composes the trainer config first: a misspelt override stops it, named."""
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("SERVER_ARGS", "ALLOW_DEMO_CORPUS")}
    done = subprocess.run(
        ["bash", str(repo / "recipes" / "search_r1_baseline.sh"), "--no-server", override], cwd=repo, timeout=300,
        capture_output=True, text=True, check=False,
        env={**env, "PYTHON": sys.executable, "RETRIEVAL_URL": "http://127.0.0.1:9"},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the trainer config does not compose"), done.stderr
    assert named in lines[0] and lines[0].endswith("nothing was started")


@pytest.mark.slow  # eval imports the session (verl) before reading its options
def test_eval_data_files_are_read_before_anything_starts(tmp_path: Path) -> None:
    not_json, not_rows, missing = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.parquet"
    not_json.write_text("{not json\n")
    not_rows.write_text('{"question": "q"}\n')
    out = tmp_path / "out"
    for given, expected in [
        (not_json, f"error: {not_json}:1: not valid JSON"),
        (not_rows, f"error: {not_rows}: row 0 lacks the verl column(s) ['prompt', 'reward_model', 'data_source']"),
        (missing, f"error: evaluation data {missing} does not exist"),
    ]:
        line = one_error_line(run(cli_app, "eval", "--data", str(given), "--out", str(out)))
        assert line.startswith(expected), line
    assert not out.exists()  # nothing started: not even the output directory
