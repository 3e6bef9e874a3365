"""Errors a user causes, reported by the command lines as one ``error:`` line and exit code 2.

A mismatched index, a corpus line that is not JSON, a taken port or a missing file is
not a bug: its message names the file or value and the fix, and a traceback would bury
it. These are the classes listed here and every ``OSError`` (a file or model path that is
not there or cannot be read, a refused connection, a full disk). Anything else is a bug
and keeps its traceback; ``--debug`` shows the traceback of a user error too.

The classes are named by module and class, not imported: telling an exception apart must
not import the modules (faiss, torch) of a command that did not run, and a class whose
module was never imported cannot have raised the exception. ``tests/cli`` checks that
every name resolves to an exception class.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

# "module:Class"; subclasses count (AdoptionError and SearchParamsError are IndexMismatchErrors; DiskFullError is an
# OSError).
SERVER_USER_ERRORS = (
    "retrieval_server.errors:IndexMismatchError",
    "retrieval_server.docstore:CorpusFormatError",
    "retrieval_server.haproxy_front:PortInUseError",
    "retrieval_server.client:RetrievalError",  # the server is not there, or refuses the token
    "retrieval_server.encoders.onnx_runtime:OnnxExportError",  # --encoder-backend onnx on a model it cannot export
    "retrieval_server.jsonl:JsonlError",  # a JSONL file given (QA set, passages) missing or not JSON
    "retrieval_server.factory_check:IndexFactoryError",  # --factory faiss cannot make, or train on the corpus
    "retrieval_server.user_errors:UserInputError",  # the commands' own checks of what they were given
)

_DEBUG = "user_errors.debug"  # key in the click context's meta, shared by every command under the root


class UserInputError(ValueError):
    """A file or value given to a command that it cannot use, found by the command's own checks before its long work;
    the message names the option or file and the fix."""


def model_source_problem(name: str, option: str) -> str | None:
    """Why the model ``name`` (a local path or a Hugging Face hub id) cannot be loaded on this machine, else None.

    Asked before a command loads the model: offline, the hub client retries for about 30 s and then prints a
    two-line message about the internet connection, naming neither the option nor the way out.
    """
    import os
    from pathlib import Path

    if Path(name).expanduser().exists():
        return None
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or not name.strip():
        return f"{option} {name}: no such directory (a model is a local directory or a hub id such as org/name)"
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    cache = Path(constants.HF_HUB_CACHE)
    if any((cache / repo_folder_name(repo_id=name, repo_type="model") / "snapshots").glob("*")):
        return None
    fix = (
        f"pass a local directory holding the model, or download it where the hub is reachable (hf download {name}) "
        f"and set HF_HOME to that cache (this machine's: {cache.parent})"
    )
    absent = f"{option} {name}: not on this machine (no such directory, not in {cache})"
    truthy = {"1", "ON", "YES", "TRUE"}
    offline = [var for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if os.environ.get(var, "").upper() in truthy]
    if offline or constants.HF_HUB_OFFLINE:
        return f"{absent} and {offline[0] if offline else 'HF_HUB_OFFLINE'} is set: {fix}"
    import httpx

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    try:  # one request, no retries: the loader's own download retries with back-off for about 30 s
        answer = httpx.get(f"{endpoint.rstrip('/')}/api/models/{name}", timeout=5.0)
    except httpx.HTTPError as err:
        return f"{absent} and {endpoint} is unreachable ({type(err).__name__}: {err}): {fix}"
    if answer.status_code in (401, 403, 404):
        return (
            f"{absent} and {endpoint} has no public model of that name (HTTP "
            f"{answer.status_code}): check the name, `hf auth login` for a gated or private model, or pass a local "
            "directory"
        )
    return None


def check_model_source(name: str | None, option: str) -> None:
    """Raise :class:`UserInputError` if the model ``name`` given as ``option`` cannot be loaded here (None: the
    command's default)."""
    if name is not None:
        problem = model_source_problem(str(name), option)
        if problem is not None:
            raise UserInputError(problem)


def check_device(device: str | None, option: str) -> None:
    """Raise :class:`UserInputError` unless torch can place a model on ``device`` here (None: the command chooses).
    Asked before the command reads its inputs: torch says so only when the model moves, with a traceback."""
    if device is None or device == "cpu":
        return
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UserInputError(f"{option} {device}: not a torch device (cpu, cuda, cuda:1, mps, ...)") from None
    available = {
        "cuda": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "mps": 1 if torch.backends.mps.is_available() else 0,
    }
    count = available.get(parsed.type)
    if count is not None and (parsed.index or 0) >= count:
        seen = f"{count} {parsed.type} device(s)" if count else f"no {parsed.type} device torch can use"
        raise UserInputError(f"{option} {device}: this machine has {seen}; pass --device cpu or leave it out")


def check_server_answers(url: str | None, option: str, path: str, fix: str) -> None:
    """Raise :class:`UserInputError` unless a server answers at ``url`` (any HTTP status will do: a token or a path it
    does not know is the requests' own error). Asked once before a command starts work that reaches it, where a
    server that is not there costs a minute of retries per request, or a run of failed examples."""
    if url is None:
        return
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}{path}", timeout=10.0)
    except httpx.HTTPError as err:
        reason = " ".join(f"{type(err).__name__}: {err}".split())
        raise UserInputError(f"{option} {url} does not answer ({reason}): {fix}") from None


def loaded_classes(names: Sequence[str]) -> tuple[type[BaseException], ...]:
    """The classes of ``names`` whose modules are imported (only those can have raised an exception)."""
    found = []
    for name in names:
        module_name, _, class_name = name.partition(":")
        module = sys.modules.get(module_name)
        if module is not None:
            found.append(getattr(module, class_name))
    return tuple(found)


def user_error_message(err: BaseException, names: Sequence[str]) -> str | None:
    """The one line to print for ``err`` if it is a user error, else None."""
    if isinstance(err, OSError):  # the machine's answer, not the code's: a path not there, a model not found, ...
        return f"{err.filename}: {err.strerror}" if err.filename is not None and err.strerror else str(err)
    if isinstance(err, loaded_classes(names)):
        return str(err)
    return None


def debug_option(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback of an error a user can cause."),
) -> None:
    ctx.meta[_DEBUG] = debug


def boundary_group(names: Sequence[str]) -> type[TyperGroup]:
    """A ``typer.Typer(cls=...)`` whose commands' user errors (``names``, see above) end in one line, exit code 2.

    Give the Typer ``callback=debug_option`` too for ``--debug``. Nested sub-apps need nothing:
    their commands run inside the root group's ``invoke``.
    """
    user_errors = tuple(names)

    class UserErrorBoundary(TyperGroup):
        def invoke(self, ctx: typer.Context) -> Any:
            try:
                return super().invoke(ctx)
            except Exception as err:
                message = None if ctx.meta.get(_DEBUG) else user_error_message(err, user_errors)
                if message is None:
                    raise
                typer.echo(f"error: {message}", err=True)
                raise typer.Exit(2) from None

    return UserErrorBoundary
