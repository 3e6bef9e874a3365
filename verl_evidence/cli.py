"""The ``verl-evidence`` command line.

Each area owns its commands in its own module and adds them here through a
``register(app)`` function, so this file stays a table of contents:

    serve / index ...   retrieval_server.cli
    data ...            verl_evidence.dataprep.cli
    eval                verl_evidence.eval.cli
    demo                verl_evidence.eval.demo
    evipath ...         verl_evidence.evipath.cli
    smoke ...           verl_evidence.local.smoke.cli

A command module imports its heavy libraries (torch, verl, pyarrow, matplotlib) inside the
command that uses them: every ``--help`` imports all command modules, and stays instant
(``tests/cli`` checks the modules imported).

Errors a user can cause end in one ``error:`` line and exit code 2, through one boundary
(``retrieval_server.user_errors``); ``--debug`` shows their traceback.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import typer

from retrieval_server.user_errors import SERVER_USER_ERRORS, boundary_group, debug_option

# "module:Class" (see retrieval_server.user_errors); the server's are included.
USER_ERRORS = (
    *SERVER_USER_ERRORS,
    "verl_evidence.dataprep.records:DataPrepError",  # data files: missing, unreadable, bad rows
    "verl_evidence.reward_managers.judge:NLIJudgeLoadError",  # --nli-model not there or not an NLI model
)

app = typer.Typer(
    name="verl-evidence",
    help="Evidence-aware RL for retrieval-augmented agents on verl.",
    no_args_is_help=True,
    cls=boundary_group(USER_ERRORS),
    callback=debug_option,
    pretty_exceptions_show_locals=False,
    # click's plain help for every subcommand: option names whole at 80 columns (rich's table cut them), no boxes
    rich_markup_mode=None,
)

_COMMAND_MODULES = (
    "retrieval_server.cli",
    "verl_evidence.dataprep.cli",
    "verl_evidence.eval.cli",
    "verl_evidence.eval.demo",
    "verl_evidence.evipath.cli",
    "verl_evidence.local.smoke.cli",
)


@app.command()
def version() -> None:
    """Print the installed versions of verl-evidence and verl, and where verl_evidence is imported from."""
    from importlib.metadata import version as dist_version

    import verl_evidence

    location = Path(verl_evidence.__file__).resolve().parent  # which copy runs (a second clone, an old install)
    typer.echo(f"verl-evidence {dist_version('verl-evidence')} (verl {dist_version('verl')}) from {location}")


def _register_commands() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:  # a real missing dependency inside the module: say so
                raise
            continue
        if name == "retrieval_server.cli":
            module.register(app, _bundled_server_data(module))  # the server has no data of its own: ours
        else:
            module.register(app)


def _bundled_server_data(server_cli):
    """What ``serve`` and ``index build/recall`` use when given no corpus, index or QA set: the bundled set."""
    from verl_evidence import bundled

    return server_cli.DefaultData(
        corpus=bundled.corpus_path,
        qa=bundled.qa_path,
        description="the bundled DEMO corpus (322 passages, for trying things out)",
    )


_register_commands()

if __name__ == "__main__":
    app()
