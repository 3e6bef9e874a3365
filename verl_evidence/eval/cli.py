"""``verl-evidence eval``: evaluate a policy through the rollout hooks and write the report."""

from __future__ import annotations

import logging
from pathlib import Path

import typer
from rich.console import Console

from retrieval_server.user_errors import check_device, check_model_source, check_server_answers
from verl_evidence.eval import options
from verl_evidence.eval.paper_scoring import DEFAULT_BERTSCORE_MODEL

logger = logging.getLogger(__name__)
console = Console(stderr=True)

RESULTS_FILE = "results.jsonl"


def register(app: typer.Typer) -> None:
    app.command(name="eval")(eval_command)


def search_settings_from_options(evipath: str | None, settings: list[str] | None) -> dict:
    """``evidence_search`` settings: the EviPath preset, then each ``KEY=VALUE`` (YAML value) over it."""
    import dataclasses

    import yaml

    from verl_evidence.agent_loops.search_loop_settings import EVIPATH_SETTINGS, SearchLoopSettings

    merged: dict = {}
    if evipath is not None:
        if evipath not in EVIPATH_SETTINGS:
            raise typer.BadParameter(f"--evipath must be one of {', '.join(EVIPATH_SETTINGS)}, got {evipath!r}")
        merged.update(EVIPATH_SETTINGS[evipath])
    known = {f.name for f in dataclasses.fields(SearchLoopSettings)}
    for item in settings or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in known:
            raise typer.BadParameter(
                f"--search-setting {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}"
            )
        merged[key] = yaml.safe_load(value) if value.strip() else None
    try:
        SearchLoopSettings(**merged)
    except (TypeError, ValueError) as err:
        raise typer.BadParameter(f"evidence_search settings {merged}: {err}") from err
    return merged


def policy_label(policy) -> str:
    """A results-table row name for a policy given as --trajectories, --model or --endpoint."""
    if policy.kind == "endpoint":
        return str(policy.model_name)
    return Path(policy.target).name


def checkpoint_policies(paths: list[Path], merged_dir: Path, tokenizer: Path | None):
    """HF policies of the merged ``--checkpoint`` s, their row labels, and the tokenizer directory.

    Every checkpoint is checked before any is merged; a bad one ends the command with
    exit code 2 and one line naming the directory and what it lacks.
    """
    from verl_evidence.eval.checkpoints import CheckpointError, checkpoint_labels, find_checkpoint, merge_checkpoint
    from verl_evidence.eval.runner import PolicySpec

    try:
        found = [find_checkpoint(p) for p in paths]
    except CheckpointError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
    seen: dict[Path, Path] = {}
    for given, ckpt in zip(paths, found):
        if ckpt.path in seen:
            typer.echo(f"error: --checkpoint {given} is given twice (also as {seen[ckpt.path]})", err=True)
            raise typer.Exit(2)
        seen[ckpt.path] = given
    policies, labels = [], {}
    for ckpt, label in zip(found, checkpoint_labels([c.path for c in found])):
        with console.status(f"merging {ckpt.actor_dir} with verl's model merger"):
            merged = merge_checkpoint(ckpt, merged_dir)
        how = "merged" if merged.merged_now else "cached merge"
        console.print(f"[bold]{label}[/]: {how} {merged.model_dir}")
        policy = PolicySpec("hf", str(merged.model_dir))
        policies.append(policy)
        labels[policy.policy_id] = label
    if tokenizer is None:  # a run's checkpoints share the tokenizer verl saved with them
        tokenizer = Path(policies[0].target)
    _check_same_vocabulary(tokenizer, [Path(p.target) for p in policies])
    return policies, labels, tokenizer


def _check_same_vocabulary(tokenizer_dir: Path, model_dirs: list[Path]) -> None:
    """The session decodes every policy's tokens with one tokenizer: their vocabularies must agree."""
    from transformers import AutoTokenizer

    vocabulary = AutoTokenizer.from_pretrained(str(tokenizer_dir)).get_vocab()
    for model_dir in model_dirs:
        if AutoTokenizer.from_pretrained(str(model_dir)).get_vocab() != vocabulary:
            typer.echo(
                f"error: the tokenizer of {model_dir} differs from {tokenizer_dir}'s: evaluate checkpoints of one "
                "base model together (or run eval once per model)",
                err=True,
            )
            raise typer.Exit(2)


def paper_scorers(reader: tuple, bertscore: tuple, judge: tuple) -> dict:
    """The reader, BERTScore and judge asked for, loaded (or reached) now: a problem ends here, in one line.

    ``reader`` / ``judge``: (target, served model, prompt file); ``bertscore``: (on, model, layers).
    """
    from verl_evidence.eval.paper_scoring import BertScorer, Judge, PaperScoringError, Reader

    try:
        return {
            "reader": Reader.create(*reader) if reader[0] else None,
            "bertscore": BertScorer(*bertscore[1:]) if bertscore[0] else None,
            "judge": Judge.create(*judge) if judge[0] else None,
        }
    except PaperScoringError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err


def score_records(records, scorers: dict, cache, concurrency: int) -> list[str]:
    """Reader / BERTScore / judge over the records (results into the cache); the report's notes about it."""
    from verl_evidence.eval.paper_scoring import score_as_the_papers

    with console.status("scoring as the papers do (reader / BERTScore / judge)"):
        changed, failures = score_as_the_papers(records, **scorers, concurrency=concurrency, on_update=cache.add)
    notes = [f"{name}: {step.identity}" for name, step in scorers.items() if step is not None]
    console.print(f"[bold]paper scoring[/]: {changed} record(s) scored now; " + "; ".join(notes))
    if failures:
        console.print(f"[red]{len(failures)} reader/judge request(s) failed[/] (asked again on the next run):")
        for line in failures[:10]:
            console.print(f"  {line}", markup=False)
        notes.append(f"{len(failures)} reader/judge request(s) failed; first: {failures[0]}")
    return notes


def paper_and_noise_options(paper, table, noise_passages, data, corpus, trajectories) -> tuple[str | None, tuple]:
    """--table and --noise-passages checked before anything starts: (the compared rollout family, the counts k)."""
    from verl_evidence.eval.noise import parse_noise_levels
    from verl_evidence.eval.paper_results import paper_layout

    family = None
    if table is not None and paper is None:
        raise typer.BadParameter("--table names a table of a paper: give --paper too")
    if paper is not None:
        try:
            family = paper_layout(paper, table).family
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
    if noise_passages is None:
        return family, ()
    try:
        levels = parse_noise_levels(noise_passages)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if trajectories is not None:
        raise typer.BadParameter("--noise-passages changes the prompts: it needs a live policy, not --trajectories")
    if data and corpus is None:
        raise typer.BadParameter("--noise-passages with --data: give --corpus, the corpus to draw the passages from")
    return family, levels


def noisy_rows(rows: list[dict], levels: tuple, corpus: Path | None, session, qa_path: Path | None = None) -> list:
    """``rows`` with EviOmni's added irrelevant passages (--noise-passages), or as they are without it."""
    if not levels:
        return rows
    from verl_evidence.dataprep.records import read_corpus
    from verl_evidence.eval.datasets import bundled_qa_records
    from verl_evidence.eval.noise import with_noise_passages

    pool = read_corpus(corpus) if corpus is not None and qa_path is None else bundled_qa_records(qa_path, corpus)[1]
    tokenizer = session.tokenizer
    try:
        return with_noise_passages(
            rows, pool, levels, lambda text: len(tokenizer.encode(text, add_special_tokens=False))
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def check_servers(retrieval_url: str | None, endpoint: str | None) -> None:
    """The retrieval server and the policy's endpoint given answer, before anything starts: an absent one costs a
    minute of retries per search, or fails every example."""
    fix = "start it (verl-evidence serve), or leave --retrieval-url out to serve the bundled corpus here"
    check_server_answers(retrieval_url, "--retrieval-url", "/health", fix)
    fix = "start the OpenAI-compatible server (e.g. vllm serve <model>) or pass its URL"
    check_server_answers(endpoint, "--endpoint", "/models", fix)


def run_baseline_command(kind, reader, data, qa, corpus, retrieval_url, limit, out, paper, table) -> None:
    """``eval --baseline zero|cot|full``: the QA generator's answers, reported and tabled like a policy's."""
    from verl_evidence.eval.paper_baselines import BASELINES, baseline_rows, run_baseline
    from verl_evidence.eval.paper_scoring import PaperScoringError
    from verl_evidence.eval.paper_table import build_paper_layout_table, paper_table_markdown, write_paper_table
    from verl_evidence.eval.progress import metrics_rich_table, print_paper_table
    from verl_evidence.eval.report import write_report

    if kind not in BASELINES:
        raise typer.BadParameter(f"choose one of {', '.join(BASELINES)}", param_hint="--baseline")
    try:
        rows, note = baseline_rows(data, retrieval_url, qa, corpus, limit)
        records, label = run_baseline(kind, *reader, rows, concurrency=4)
    except (PaperScoringError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
    labels = {records[0].policy: label} if records else {}
    sections, layout = [], None
    if paper is not None:
        try:
            layout = build_paper_layout_table(records, paper, lambda p: labels.get(p, p), table=table)
        except ValueError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from err
        write_paper_table(layout, out, row_header="baseline", stem=f"paper_{paper}_baseline_{kind}")
        sections.append((f"As in the {paper} paper", paper_table_markdown(layout, "baseline")))
    notes = [f"EviOmni's {label} baseline: no policy; the reader answers with its prompt.", note]
    report = write_report(
        records, out, title=f"Baseline {label}", notes=notes, extra_sections=sections, policy_labels=labels
    )
    console.print(metrics_rich_table(records, title=label))
    if layout is not None:
        print_paper_table(console, layout, "baseline", title=f"as in the {paper} paper")
    failed = [r for r in records if r.error]
    if failed:
        console.print(f"[red]{len(failed)} example(s) failed[/]; first: {failed[0].error}")
    console.print(f"report: {report.markdown}")


def eval_command(
    data: list[Path] = typer.Option(
        None,
        "--data",
        help="verl rows to evaluate (parquet from `verl-evidence data`, or JSONL); repeatable. "
        "Default: the bundled QA set.",
    ),
    rollouts: str = typer.Option("search,eviomni,grace", help="rollout families for the bundled set"),
    qa: options.QA = None,
    corpus: Path = typer.Option(None, help="corpus JSONL of --qa (the retrieval server must serve it)"),
    trajectories: options.Trajectories = None,
    model: options.Model = None,
    endpoint: options.Endpoint = None,
    served_model: options.ServedModel = None,
    tokenizer: options.Tokenizer = None,
    retrieval_url: options.RetrievalUrl = None,
    nli_model: options.NliModel = None,
    decoding: options.Decoding = None,
    max_response_tokens: options.MaxResponseTokens = 4096,
    max_turn_tokens: options.MaxTurnTokens = 512,
    nli_device: str = typer.Option("cpu", help="device of the NLI judge"),
    out: Path = typer.Option(Path("outputs/eval"), help="report, plots and results cache go here"),
    limit: int = typer.Option(None, help="only the first N questions (bundled) or rows (--data)"),
    concurrency: int = typer.Option(4, help="examples in flight at once"),
    evipath: str = typer.Option(
        None,
        help="run the search rollouts as an EviPath SFT'd planner, exactly as trained: 'paper' or 'search' "
        "(its --planner-format); observations are user turns answered by the executor (the policy itself, or "
        "an endpoint via --search-setting extractor=openai ...)",
    ),
    search_setting: list[str] = typer.Option(
        None,
        "--search-setting",
        help="an evidence_search loop setting KEY=VALUE (docs/rollouts.md), e.g. "
        "observation_role=user; repeatable; applied after --evipath",
    ),
    fresh: bool = typer.Option(False, help="ignore the results cache and start over"),
    checkpoint: list[Path] = typer.Option(
        None,
        "--checkpoint",
        help="a verl checkpoint (global_step_N directory) as the policy: its actor's FSDP "
        "shards are merged with verl's model merger (once, cached) and generate with HF; repeatable: one table row "
        "each",
    ),
    merged_dir: Path = typer.Option(
        None,
        help="cache of merged --checkpoint models (default: OUT/merged); a checkpoint is merged again only "
        "when its shard files change",
    ),
    paper: str = typer.Option(
        None,
        help="also give the results in this paper's main table (eviomni, lear, evinote, grace), its reported "
        "numbers as reference rows beside yours: printed, and written to OUT/paper_<PAPER>.md and .csv",
    ),
    table: str = typer.Option(
        None,
        help="with --paper: another of its tables, e.g. an ablation (evinote 2-5, eviomni 4 and fig5, lear 6 and "
        "fig6, grace 5; docs/evaluation.md); written to OUT/paper_<PAPER>_table<N>.md and .csv",
    ),
    noise_passages: str = typer.Option(
        None,
        help="EviOmni's noise test (Fig. 5): each EviOmni/LEAR row once per count k, with k irrelevant corpus "
        "passages after its own, e.g. 0,2,4,6,8; data sources become <source>+noise<k>; passages come from --corpus "
        "(default: the bundled corpus, with the bundled questions)",
    ),
    reader: str = typer.Option(
        None,
        help="EviOmni/LEAR scoring: a separate reader (HF model dir, or OpenAI-compatible URL with "
        "--reader-model) answers from each example's extracted evidence; its EM/F1 beside the policy's own",
    ),
    reader_model: str = typer.Option(None, help="the model name served at a --reader URL"),
    reader_prompt: Path = typer.Option(
        None, help="the reader's prompt file (default: the packaged eviomni_reader; {question} {document})"
    ),
    bertscore: bool = typer.Option(
        False, help="GRACE scoring: BERTScore F1 of the answerable examples (needs the [eval] extra)"
    ),
    bertscore_model: str = typer.Option(
        DEFAULT_BERTSCORE_MODEL, help="BERTScore model: a name bert-score knows (default: GRACE's), or a local dir"
    ),
    bertscore_layers: int = typer.Option(
        None, help="BERTScore layer (default: bert-score's for a known name; needed for a local directory)"
    ),
    judge: str = typer.Option(
        None,
        help="GRACE scoring: an LLM judge (OpenAI-compatible URL with --judge-model, or an HF model dir) "
        "grades each answer or refusal",
    ),
    judge_model: str = typer.Option(None, help="the model name served at a --judge URL"),
    judge_prompt: Path = typer.Option(
        None,
        help="the judge's prompt file (default: the packaged grace_judge; {question} {gold_answers} "
        "{evidence_status} {response})",
    ),
    baseline: str = typer.Option(
        None,
        help="EviOmni's baselines, no policy: the --reader answers each EviOmni row from the question alone (zero, "
        "Table 12), from its 5 retrieved passages (full) or from them step by step (cot, Table 13); --reader-prompt "
        "replaces the prompt; with --paper eviomni the paper's rows beside yours",
    ),
) -> None:
    """Evaluate a policy (replayed trajectories, HF model dir or endpoint) and write a Markdown report.

    Every example runs through the plugin's agent loops against the retrieval
    server and is scored by the reward managers through verl's reward loop.
    Finished examples are cached in OUT/results.jsonl, so an interrupted run
    resumes where it stopped.
    """
    from verl_evidence.eval import replay
    from verl_evidence.eval.cache import ResultsCache
    from verl_evidence.eval.datasets import ROLLOUTS, bundled_rows, examples_from_rows, load_rows
    from verl_evidence.eval.paper_results import PAPERS
    from verl_evidence.eval.paper_table import (
        build_paper_layout_table,
        build_paper_table,
        paper_table_markdown,
        write_paper_table,
    )
    from verl_evidence.eval.progress import (
        metrics_rich_table,
        print_paper_table,
        quiet_library_logs,
        run_with_progress,
    )
    from verl_evidence.eval.report import write_report
    from verl_evidence.eval.session import make_runner, open_session

    quiet_library_logs()
    search_settings = search_settings_from_options(evipath, search_setting)
    wanted = [r.strip() for r in rollouts.split(",") if r.strip()]
    bad = sorted(set(wanted) - set(ROLLOUTS))
    if bad:
        raise typer.BadParameter(f"unknown rollout(s) {bad}; choose from {', '.join(ROLLOUTS)}")
    for path in data or []:  # read before anything starts: a file that is not rows ends here, in one line
        load_rows(path)
    check_model_source(nli_model, "--nli-model")
    check_model_source(str(tokenizer) if tokenizer is not None else None, "--tokenizer")
    check_servers(retrieval_url, endpoint)
    check_device(None if nli_device == "auto" else nli_device, "--nli-device")
    if paper is not None and paper not in PAPERS:
        raise typer.BadParameter(f"--paper must be one of {', '.join(PAPERS)}, got {paper!r}")
    if baseline is not None:
        ignored = {
            "--trajectories": trajectories,
            "--model": model,
            "--endpoint": endpoint,
            "--checkpoint": checkpoint,
            "--noise-passages": noise_passages,
            "--judge": judge,
            "--bertscore": bertscore or None,
        }
        given = [name for name, value in ignored.items() if value]
        if given:
            raise typer.BadParameter(f"--baseline runs no policy and no other scoring: drop {', '.join(given)}")
        run_baseline_command(
            baseline, (reader, reader_model, reader_prompt), data, qa, corpus, retrieval_url, limit, out, paper, table
        )
        return
    paper_family, noise_levels = paper_and_noise_options(paper, table, noise_passages, data, corpus, trajectories)
    scorers = paper_scorers(
        (reader, reader_model, reader_prompt),
        (bertscore, bertscore_model, bertscore_layers),
        (judge, judge_model, judge_prompt),
    )
    if checkpoint:  # (after the cheap checks: a merge can take minutes)
        if any(x is not None for x in (trajectories, model, endpoint)):
            raise typer.BadParameter("--checkpoint is the policy: give no --trajectories, --model or --endpoint")
        policies, labels, tokenizer = checkpoint_policies(checkpoint, merged_dir or out / "merged", tokenizer)
    else:
        policy, tokenizer = options.policy_and_tokenizer(trajectories, model, endpoint, served_model, tokenizer)
        policies, labels = [policy], {policy.policy_id: policy_label(policy)}
    policy = policies[0]
    decoding_choice = options.decoding_from_option(decoding, policy.kind)
    if search_settings and policy.kind == "replay":
        raise typer.BadParameter(
            "--evipath / --search-setting need a live policy (--model or --endpoint); "
            "replayed trajectories follow the default search protocol"
        )
    if nli_model is None:
        from verl_evidence.eval.session import RANDOM_JUDGE_NOTE

        console.print(f"[bold yellow]WARNING:[/] {RANDOM_JUDGE_NOTE}")
    out.mkdir(parents=True, exist_ok=True)
    cache_path = out / RESULTS_FILE
    if fresh and cache_path.exists():
        cache_path.unlink()
    cache = ResultsCache(cache_path)

    with open_session(
        out / "work",
        tokenizer_dir=tokenizer,
        retrieval_url=retrieval_url,
        nli_model=nli_model,
        nli_device=nli_device,
        response_length=max_response_tokens,
        max_tokens_per_turn=max_turn_tokens,
        search_settings=search_settings,
    ) as session:
        session.notes.append(
            decoding_choice.describe() if decoding_choice else "Decoding: none (replayed texts, decoded already)."
        )
        if policy.kind == "replay":
            examples = replay.replay_examples(
                replay.load_trajectories(policy.target),
                session,
                rollouts=wanted,
                limit=limit,
                data=data,
                qa_path=qa,
                corpus_path=corpus,
            )
        elif data:
            rows = [row for path in data for row in load_rows(path)]
            examples = examples_from_rows(noisy_rows(rows[:limit] if limit else rows, noise_levels, corpus, session))
        else:
            rows = bundled_rows(
                wanted, session.retrieval_url, session.tokenizer, limit=limit, qa_path=qa, corpus_path=corpus
            )
            examples = examples_from_rows(noisy_rows(rows, noise_levels, corpus, session, qa_path=qa))
        if not examples:
            raise typer.BadParameter("nothing to evaluate: no rows (check --data / --rollouts / --limit)")
        if paper is not None and not any(e.rollout == paper_family for e in examples):
            raise typer.BadParameter(
                f"--paper {paper} compares {paper_family!r} rollouts; none among the examples "
                "(check --data / --rollouts)"
            )
        records = []
        for policy in policies:
            console.print(f"[bold]evaluating[/] {policy.policy_id} on {len(examples)} examples; cache {cache_path}")
            runner = make_runner(session, policy, concurrency=concurrency)
            runner.decoding = decoding_choice
            label = labels.pop(policy.policy_id)
            if search_settings:  # results of another loop protocol must not come from the cache
                import json

                runner.policy_id += f"|evidence_search:{json.dumps(search_settings, sort_keys=True)}"
            labels[runner.policy_id] = label
            records += run_with_progress(runner, examples, cache, console)
            del runner  # one merged checkpoint in memory at a time
        if any(scorers.values()):
            session.notes += score_records(records, scorers, cache, concurrency)
        title = f"Evaluation of {', '.join(labels.values())}" if checkpoint else f"Evaluation of {policy.policy_id}"
        row_header = "checkpoint" if checkpoint else "policy"
        extra_sections, paper_files, layout = [], (), None
        if paper is not None:
            layout = build_paper_layout_table(
                records, paper, lambda p: labels.get(p, p), policy_order=list(labels), table=table
            )
            stem = f"paper_{paper}" + (
                "" if not table else f"_{table}" if table.startswith("fig") else f"_table{table}"
            )
            paper_files = write_paper_table(layout, out, row_header=row_header, stem=stem)
            extra_sections.append((f"As in the {paper} paper", paper_table_markdown(layout, row_header)))
        report = write_report(
            records,
            out,
            title=title,
            notes=session.notes,
            extra_sections=extra_sections,
            policy_labels=labels,
            row_header=row_header,
        )
    if checkpoint:
        results = build_paper_table(records, lambda p: labels.get(p, p), policy_order=list(labels))
        print_paper_table(console, results, row_header, title="results by checkpoint and data source")
    else:
        console.print(metrics_rich_table(records, title=f"{policy.policy_id}"))
    if layout is not None:
        print_paper_table(console, layout, row_header, title=f"as in the {paper} paper")
    for note in session.notes:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"report: {report.markdown}")
    console.print(f"table:  {report.table_markdown}, {report.table_csv}")
    if paper_files:
        console.print(f"paper:  {paper_files[0]}, {paper_files[1]}")
    for png in report.images:
        console.print(f"plot:   {png}")
    failed = [r for r in records if r.error]
    if failed:
        console.print(f"[red]{len(failed)} example(s) failed[/]; see the report's last section")
