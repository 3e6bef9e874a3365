"""Command-line options shared by ``verl-evidence eval`` and ``verl-evidence demo``.

Both commands pick one policy (replayed trajectories, an HF model directory or
an OpenAI-compatible endpoint), talk to a retrieval server and score with the
same judge and token budgets; the options and their checks live here once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Trajectories = Annotated[
    Path | None, typer.Option(help="replay these recorded trajectories (JSONL) instead of the bundled ones")
]
Model = Annotated[Path | None, typer.Option(help="a local Hugging Face causal LM directory as the policy (CPU or GPU)")]
Endpoint = Annotated[str | None, typer.Option(help="an OpenAI-compatible server (e.g. vLLM) as the policy")]
ServedModel = Annotated[str | None, typer.Option(help="model name at --endpoint")]
Tokenizer = Annotated[
    Path | None,
    typer.Option(help="policy tokenizer dir (default: --model, or the offline test tokenizer; needed with --endpoint)"),
]
QA = Annotated[Path | None, typer.Option(help="FlashRAG QA JSONL with gold annotations instead of the bundled QA set")]
RetrievalUrl = Annotated[
    str | None, typer.Option(help="use this retrieval server instead of starting the embedded one")
]
NliModel = Annotated[
    str | None, typer.Option(help="NLI judge for EviNote's EQR (default: a tiny RANDOM model, flagged)")
]
Decoding = Annotated[
    str | None,
    typer.Option(
        help="how a live policy samples: 'paper' (the default: each method as its paper states, GRACE temperature "
        "0.6 / top_p 0.9, the others greedy), 'greedy', or settings for every method, e.g. temperature=0.6,top_p=0.9 "
        "(keys temperature, top_p, top_k); recorded with each result"
    ),
]
MaxResponseTokens = Annotated[int, typer.Option(help="token budget of one trajectory (all turns and observations)")]
MaxTurnTokens = Annotated[int, typer.Option(help="token budget of one search-loop generation")]


def policy_from_options(trajectories: Path | None, model: Path | None, endpoint: str | None, served_model: str | None):
    """Exactly one policy; the bundled reference trajectories when none is given."""
    from verl_evidence.eval.runner import PolicySpec

    given = [x for x in (trajectories, model, endpoint) if x is not None]
    if len(given) > 1:
        raise typer.BadParameter("give at most one policy: --trajectories, --model or --endpoint")
    if model is not None:
        if not model.is_dir():
            raise typer.BadParameter(f"--model {model} is not a directory")
        return PolicySpec("hf", str(model))
    if endpoint is not None:
        if not served_model:
            raise typer.BadParameter("--endpoint needs --served-model (the model name the server serves)")
        return PolicySpec("endpoint", endpoint, served_model)
    if trajectories is None:
        from verl_evidence import bundled

        trajectories = bundled.trajectories_path()
    if not Path(trajectories).is_file():
        raise typer.BadParameter(f"--trajectories {trajectories} is not a file")
    return PolicySpec("replay", str(trajectories))


def policy_and_tokenizer(
    trajectories: Path | None,
    model: Path | None,
    endpoint: str | None,
    served_model: str | None,
    tokenizer: Path | None,
):
    """The policy, and the tokenizer directory it needs (a model directory is its own tokenizer)."""
    policy = policy_from_options(trajectories, model, endpoint, served_model)
    if tokenizer is None and policy.kind == "hf":
        tokenizer = Path(policy.target)
    if policy.kind == "endpoint" and tokenizer is None:
        raise typer.BadParameter("--endpoint needs --tokenizer: the served model's tokenizer directory")
    return policy, tokenizer


def decoding_from_option(decoding: str | None, policy_kind: str):
    """The ``--decoding`` choice for a policy: None for replayed texts (they were decoded already); a value that
    names no setting, or one given with replayed texts, ends the command in one line."""
    from verl_evidence.eval.decoding import DecodingError, parse_decoding

    try:
        choice = parse_decoding(decoding)
    except DecodingError as err:
        raise typer.BadParameter(str(err)) from err
    if policy_kind != "replay":
        return choice
    if decoding is not None:
        raise typer.BadParameter(
            "--decoding needs a live policy (--model, --endpoint or --checkpoint): replayed trajectories are texts "
            "decoded already"
        )
    return None
