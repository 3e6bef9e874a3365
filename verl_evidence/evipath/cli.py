"""``verl-evidence evipath synthesize``: teacher-driven trajectory synthesis to SFT parquet."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from retrieval_server.user_errors import check_device, check_model_source
from verl_evidence.agent_loops.protocol import PLANNER_LAYOUTS as PLANNER_FORMATS
from verl_evidence.evipath.demonstrations import DEFAULT_DEMONSTRATIONS
from verl_evidence.evipath.evidence import DEFAULT_TAU, EvidenceSelector
from verl_evidence.evipath.pipeline import Prompts, Statistics, SynthesisConfig, Synthesizer
from verl_evidence.evipath.records import FORMATS, ReadReport, load_records
from verl_evidence.evipath.teacher import ReplyCache, Teacher, TeacherConfig

logger = logging.getLogger(__name__)


@dataclass
class RunSummary:
    stats: Statistics
    outputs: dict[str, Path]
    teacher: dict
    read: ReadReport


async def run_synthesis(
    records,
    teacher_config: TeacherConfig,
    out_dir: str | Path,
    cache_path: str | Path | None,
    selector: EvidenceSelector,
    config: SynthesisConfig | None = None,
    planner_format: str = "paper",
    console: Console | None = None,
    read_report: ReadReport | None = None,
    val_fraction: float = 0.0,
    graph=None,
) -> RunSummary:
    """Synthesize, filter and write; the cache makes a re-run after an interruption cheap.

    With ``graph`` (a :class:`~verl_evidence.evipath.kg.KnowledgeGraph`) the records are KG records and the planner
    takes the knowledge-graph form (Table 8); its planner rows are written in the ``kg`` layout."""
    config = config or SynthesisConfig()
    cache = ReplyCache(cache_path)
    teacher = Teacher(teacher_config, cache)
    stats = Statistics()
    console = console or Console(stderr=True)
    try:
        with Progress(
            TextColumn("[bold]evipath"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            task = progress.add_task("", total=len(records))

            def on_result(result) -> None:
                stats.add(result)
                progress.update(
                    task,
                    advance=1,
                    description=f"kept {stats.kept} rejected {stats.total - stats.kept} "
                    f"requests {teacher.usage.requests} cached {teacher.usage.cache_hits}",
                )

            if graph is not None:
                from verl_evidence.evipath.kg_synthesis import KGSynthesizer

                synthesizer = KGSynthesizer(teacher, selector, graph, config)
                planner_format = "kg"
            else:
                synthesizer = Synthesizer(teacher, selector, config)
            results = await synthesizer.synthesize(
                records, max_in_flight=max(1, teacher_config.concurrency * 2), on_result=on_result
            )
    finally:
        await teacher.close()
        cache.close()
    from verl_evidence.evipath.writer import write_outputs  # pyarrow: not needed for --help

    outputs = write_outputs(
        results, out_dir, planner_format=planner_format, seed=config.seed, val_fraction=val_fraction
    )
    usage = teacher.usage
    teacher_summary = {
        "model": teacher_config.model,
        "requests": usage.requests,
        "cache_hits": usage.cache_hits,
        "failures": usage.failures,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cost": round(teacher.cost(), 6),
    }
    summary = {**stats.as_dict(), "teacher": teacher_summary}
    (Path(out_dir) / "stats.json").write_text(json.dumps(summary, indent=2) + "\n")
    return RunSummary(stats, outputs, teacher_summary, read_report or ReadReport())


def print_summary(summary: RunSummary, console: Console) -> None:
    table = Table(title="EviPath synthesis")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    table.add_row("kept", str(summary.stats.kept))
    for reason, count in summary.stats.rejected.most_common():
        table.add_row(f"rejected: {reason}", str(count))
    for reason, count in summary.read.skipped.most_common():
        table.add_row(f"skipped input: {reason}", str(count))
    table.add_row("sub-questions (kept)", str(summary.stats.subquestions))
    table.add_row("selection fallbacks (best one < tau)", str(summary.stats.selection_fallbacks))
    console.print(table)
    t = summary.teacher
    console.print(
        f"teacher {t['model']}: {t['requests']} requests, {t['cache_hits']} cache hits, {t['failures']} failures, "
        f"{t['prompt_tokens']} prompt + {t['completion_tokens']} completion tokens, cost {t['cost']:.4f}"
    )
    for name, path in summary.outputs.items():
        console.print(f"{name}: {path}")


def teacher_problem(base_url: str, model: str, api_key: str) -> str | None:
    """Why the teacher cannot answer (the endpoint is not there, or does not serve ``model``), else None: asked once
    before synthesis, where an absent endpoint fails every record after its retries and writes empty files."""
    import httpx

    try:
        answer = httpx.get(f"{base_url.rstrip('/')}/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=10)
    except httpx.HTTPError as err:
        return (
            f"the teacher endpoint --base-url {base_url} does not answer ({type(err).__name__}: {err}): start the "
            "OpenAI-compatible server (e.g. vllm serve <model>) or pass its URL (--base-url or EVIPATH_BASE_URL)"
        )
    try:
        served = [entry["id"] for entry in answer.json()["data"]] if answer.status_code == 200 else []
    except (ValueError, KeyError, TypeError):  # not a model list: the requests themselves will say what is wrong
        served = []
    if served and model not in served:
        return f"the teacher endpoint {base_url} serves {served}, not --model {model!r}: pass one of them"
    return None


def synthesize(
    input_path: Path | None = typer.Option(
        None, "--input", "-i", help="Dataset file (JSON array or JSONL); omit for the bundled set."
    ),
    fmt: str = typer.Option("bundled", "--format", "-f", help=f"Input layout: {', '.join(FORMATS)}."),
    corpus: Path | None = typer.Option(
        None, help="corpus.jsonl for --format bundled with --input (default: next to the input)."
    ),
    out: Path = typer.Option(Path("evipath_out"), "--out", "-o", help="Output directory."),
    limit: int | None = typer.Option(None, help="Use only the first N records."),
    base_url: str = typer.Option(
        "http://127.0.0.1:8000/v1", envvar="EVIPATH_BASE_URL", help="OpenAI-compatible endpoint."
    ),
    model: str = typer.Option(..., envvar="EVIPATH_MODEL", help="Teacher model name as the endpoint knows it."),
    api_key: str = typer.Option("EMPTY", envvar="OPENAI_API_KEY", help="API key (vLLM accepts any)."),
    concurrency: int = typer.Option(8, help="Maximum concurrent teacher requests."),
    max_retries: int = typer.Option(4, help="Retries with exponential backoff per request."),
    timeout: float = typer.Option(120.0, help="Seconds per request."),
    temperature: float = typer.Option(0.0),
    max_tokens: int = typer.Option(1024, help="Completion tokens per teacher reply."),
    cache: Path | None = typer.Option(None, help="Reply cache (SQLite); default OUT/teacher_cache.sqlite."),
    encoder: str | None = typer.Option(
        None, help="Sentence-transformer for evidence selection (default: packaged MiniLM)."
    ),
    encoder_device: str = typer.Option("cpu"),
    tau: float = typer.Option(DEFAULT_TAU, help="Cosine threshold for golden evidence of a sub-question."),
    min_f1: float = typer.Option(0.8, help="Keep a trajectory if EM = 1 or F1 >= this."),
    max_steps: int = typer.Option(6, help="Planner turns per trajectory."),
    max_searches: int = typer.Option(12, help="Sub-questions per trajectory."),
    planner_format: str = typer.Option("paper", help=f"Planner dialogue layout: {', '.join(PLANNER_FORMATS)}."),
    planner_form: str = typer.Option(
        "text",
        help='text: Search("q") over passages; kg: the knowledge-graph form (Table 8), Search([i], "q") over '
        "numbered candidate entities, the executor reading the entity's facts from --graph; --input is then 2Wiki "
        "rows with 'evidences' or JSONL {id, question, answer, evidence: [[s, r, o], ...], entities?}.",
    ),
    graph: Path | None = typer.Option(
        None,
        help="--planner-form kg: the graph, JSONL of [subject, relation, object] (default: the records' own evidence "
        "triples). Wikidata: fill verl_evidence.evipath.kg.WikidataGraph and call run_synthesis with it.",
    ),
    planner_synth_prompt: str = typer.Option("evipath_planner_synth", help="Prompt name or file."),
    executor_answer_prompt: str = typer.Option("evipath_executor_answer", help="Prompt name or file."),
    executor_synth_prompt: str = typer.Option("evipath_executor_synth", help="Prompt name or file."),
    demonstrations: int = typer.Option(
        DEFAULT_DEMONSTRATIONS,
        min=0,
        help="Worked examples shown to the teacher before each planner and executor request (0: zero-shot).",
    ),
    planner_demos: str = typer.Option("evipath_planner_synth_demos", help="Planner demonstrations: name or file."),
    executor_demos: str = typer.Option("evipath_executor_synth_demos", help="Executor demonstrations: name or file."),
    prompt_cost_per_1k: float = typer.Option(0.0, help="Cost per 1k prompt tokens (reporting only)."),
    completion_cost_per_1k: float = typer.Option(0.0, help="Cost per 1k completion tokens (reporting only)."),
    val_fraction: float = typer.Option(0.0, help="Share of kept trajectories written to val.parquet instead of train."),
    seed: int = typer.Option(0),
) -> None:
    """Synthesize planner/executor trajectories with a teacher and write SFT parquet."""
    console = Console(stderr=True)
    if fmt not in FORMATS:
        raise typer.BadParameter(f"choose one of {', '.join(FORMATS)}", param_hint="--format")
    if not 0.0 <= val_fraction < 1.0:
        raise typer.BadParameter("must be in [0, 1)", param_hint="--val-fraction")
    if planner_format not in PLANNER_FORMATS:
        raise typer.BadParameter(f"choose one of {', '.join(PLANNER_FORMATS)}", param_hint="--planner-format")
    if planner_form not in ("text", "kg"):
        raise typer.BadParameter("choose text or kg", param_hint="--planner-form")
    if planner_form == "kg" and (input_path is None or planner_format != "paper"):
        raise typer.BadParameter(
            "the kg form needs --input (KG records) and writes its own layout (leave --planner-format)",
            param_hint="--planner-form",
        )
    if planner_form == "kg" and (fmt != "bundled" or corpus is not None):
        raise typer.BadParameter(
            "the kg form reads 2Wiki rows ('evidences') or KG JSONL itself: give no --format or --corpus",
            param_hint="--planner-form",
        )
    if graph is not None and planner_form != "kg":
        raise typer.BadParameter("a graph is read only with --planner-form kg", param_hint="--graph")
    check_model_source(encoder, "--encoder")
    check_device(encoder_device, "--encoder-device")
    read_report = ReadReport()
    kg_graph = None
    try:
        if planner_form == "kg":
            from verl_evidence.evipath.kg_synthesis import graph_of_records, load_graph, load_kg_records

            records = load_kg_records(input_path, limit=limit, report=read_report)
            kg_graph = load_graph(graph) if graph is not None else graph_of_records(records)
        else:
            records = load_records(input_path, fmt, corpus_path=corpus, limit=limit, report=read_report)
    except (FileNotFoundError, ValueError) as err:
        typer.echo(f"error: cannot read the input: {err}", err=True)  # one line, like every user error
        raise typer.Exit(2) from err
    if not records:
        where = input_path or "the bundled set"
        typer.echo(f"error: no usable records in {where} (skipped: {dict(read_report.skipped)})", err=True)
        raise typer.Exit(2)
    if planner_form == "kg":  # the KG teacher prompt and demonstrations unless others were named
        if planner_synth_prompt == "evipath_planner_synth":
            planner_synth_prompt = "evipath_planner_kg_synth"
        if planner_demos == "evipath_planner_synth_demos":
            planner_demos = "evipath_planner_kg_synth_demos"
    prompts = Prompts(
        planner_synth_prompt, executor_answer_prompt, executor_synth_prompt, planner_demos, executor_demos
    )
    for which in ("planner_synth", "executor_synth"):  # a missing or malformed file: one line, before any request
        try:
            prompts.demonstrations(which, demonstrations)
        except (FileNotFoundError, ValueError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from err
    # after the local checks: a file problem is named without waiting for the network
    cache = cache or out / "teacher_cache.sqlite"
    problem = teacher_problem(base_url, model, api_key)
    if problem is not None:
        if not (cache.is_file() and cache.stat().st_size > 0):
            typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(2)
        console.print(f"warning: {problem}; synthesising from the replies cached in {cache}")
    config = SynthesisConfig(
        max_steps=max_steps,
        max_searches=max_searches,
        min_f1=min_f1,
        seed=seed,
        prompts=prompts,
        demonstrations=demonstrations,
    )
    teacher_config = TeacherConfig(
        model=model,
        base_url=base_url,
        api_key=api_key,
        temperature=temperature,
        max_tokens=max_tokens,
        concurrency=concurrency,
        max_retries=max_retries,
        timeout=timeout,
        prompt_cost_per_1k=prompt_cost_per_1k,
        completion_cost_per_1k=completion_cost_per_1k,
    )
    selector = EvidenceSelector(encoder, tau=tau, device=encoder_device)
    summary = asyncio.run(
        run_synthesis(
            records,
            teacher_config,
            out,
            cache,
            selector,
            config,
            planner_format=planner_format,
            console=console,
            read_report=read_report,
            val_fraction=val_fraction,
            graph=kg_graph,
        )
    )
    print_summary(summary, console)


def register(app: typer.Typer) -> None:
    evipath = typer.Typer(help="EviPath: abductive trajectory synthesis for SFT.", no_args_is_help=True)
    evipath.command("synthesize")(synthesize)
    app.add_typer(evipath, name="evipath")
