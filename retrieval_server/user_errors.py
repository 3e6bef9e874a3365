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
    "retrieval_server.index:IndexMismatchError",
    "retrieval_server.docstore:CorpusFormatError",
    "retrieval_server.haproxy_front:PortInUseError",
    "retrieval_server.client:RetrievalError",  # the server is not there, or refuses the token
    "retrieval_server.encoders.onnx_runtime:OnnxExportError",  # --encoder-backend onnx on a model it cannot export
)

_DEBUG = "user_errors.debug"  # key in the click context's meta, shared by every command under the root


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
