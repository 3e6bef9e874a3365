"""``verl-evidence smoke prepare METHOD`` / ``python -m verl_evidence.local.smoke prepare METHOD``.

Prints what ``recipes/<method>.sh --smoke`` needs (policy, data, judge, settings) as shell assignments.
"""

from __future__ import annotations

import logging

from verl_evidence.local.smoke.settings import (
    METHODS,
    WARMUP_ENV,
    WARMUP_VARIANTS,
    locked,
    smoke_dir,
    smoke_method,
    warmup_family,
)


def prepare(method: str, warmup: str | None = None) -> dict[str, str]:
    """What ``recipes/<method>.sh --smoke`` needs: policy, data, and (EviNote) the judge, as shell variables.

    ``warmup``: a warm-up variant of the method's family (settings.WARMUP_VARIANTS) instead of the family's own.
    """
    spec = smoke_method(method)
    family = warmup_family(method, warmup)
    from verl_evidence.local.smoke.models import base_policy, nli_judge, warmed_up_policy
    from verl_evidence.local.smoke.warmup_data import warmed_up_rows, warmup_data

    # Each artifact has its own lock, so processes preparing different warm-ups build them at the same time (a
    # warm-up trains on one thread) and two preparing the same one build it once.
    data_lock = locked(smoke_dir() / "data")  # the rows: seconds to build, written by several methods
    base = base_policy()
    if spec.family is None:  # verl's SFT trainer from the random policy on every family's format
        with data_lock:
            return {"MODEL_PATH": str(base), "TRAIN_FILES": str(warmup_data(base)), **spec.settings}
    policy = warmed_up_policy(family)
    with data_lock:
        data = warmed_up_rows(method, policy, warmup=family)
    variables = {"MODEL_PATH": str(policy), "TRAIN_FILES": str(data), "VAL_FILES": str(data), **spec.settings}
    if spec.nli_judge:
        variables["NLI_MODEL"] = str(nli_judge())
    return variables


def shell_assignments(method: str, warmup: str | None = None) -> list[str]:
    """``prepare(method, warmup)`` as ``NAME=value`` lines a recipe reads (values shell-quoted)."""
    import shlex

    return [f"{name}={shlex.quote(value)}" for name, value in prepare(method, warmup).items()]


def register(root) -> None:
    import typer

    smoke_app = typer.Typer(
        help="Smoke runs of the recipes on CPU (tiny warmed-up policy, bundled data).", no_args_is_help=True
    )

    @smoke_app.command("prepare")
    def prepare_command(
        method: str = typer.Argument(..., help=" | ".join(METHODS)),
        warmup: str | None = typer.Option(
            None,
            "--warmup",
            envvar=WARMUP_ENV,
            help="a warm-up variant of the method's family instead of its own (search_neutral: notes in half the "
            "warm-up examples; grace_neutral: each GRACE question answered in both paths' tags; grace_judged: the same "
            "after a judgement of the references in a think block)",
        ),
    ) -> None:
        """Build (or reuse) the smoke policy, data and judge; print them as shell assignments for the recipes."""
        if method not in METHODS:
            raise typer.BadParameter(f"{method!r} is not one of {', '.join(METHODS)}", param_hint="METHOD")
        family = smoke_method(method).family
        fitting = [family, *sorted(name for name, of in WARMUP_VARIANTS.items() if of == family)]
        if warmup and family is None:
            raise typer.BadParameter(f"{method} trains an untrained policy: no warm-up", param_hint="--warmup")
        if warmup and warmup not in fitting:  # another family's warm-up writes another format
            raise typer.BadParameter(
                f"{warmup!r} is not a warm-up of {method}, which trains the {family!r} family's format: one of "
                f"{', '.join(fitting)}",
                param_hint="--warmup",
            )
        try:
            lines = shell_assignments(method, warmup)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--warmup") from err
        for line in lines:
            typer.echo(line)

    root.add_typer(smoke_app, name="smoke")


def main(argv: list[str] | None = None) -> int:
    """``python -m verl_evidence.local.smoke prepare METHOD``: what the recipes call (``verl-evidence smoke prepare``
    without importing every command of the CLI, which costs seconds on a small machine). The warm-up variant comes
    from ``$VERL_EVIDENCE_SMOKE_WARMUP``, so ``VERL_EVIDENCE_SMOKE_WARMUP=search_neutral bash recipes/... --smoke``
    works without a recipe flag."""
    import os
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "prepare":
        print(f"usage: python -m verl_evidence.local.smoke prepare {{{','.join(METHODS)}}}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        lines = shell_assignments(args[1], os.environ.get(WARMUP_ENV) or None)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
