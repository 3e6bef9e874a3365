"""``verl-evidence data ...``: write verl parquet files for each method.

    verl-evidence data qa       FlashRAG JSONL / Search-R1 parquet -> Search-R1 or EviNote rows
    verl-evidence data eviomni  + top-k passages (retrieval server, file or in-process retriever) and L_P
    verl-evidence data grace    sufficient / insufficient contexts from several retrievers

``INPUT`` may be the word ``bundled`` for the packaged QA set and corpus.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

# Data modules (pyarrow, numpy) are imported by the commands that use them: ``--help`` stays instant.
# A DataPrepError a command raises is reported as one ``error:`` line by the CLI's error boundary.
if TYPE_CHECKING:
    from verl_evidence.dataprep import grace as grace_mod
    from verl_evidence.dataprep.records import QARecord

logger = logging.getLogger(__name__)
console = Console(stderr=True)
data_app = typer.Typer(help="Prepare verl parquet data for each method.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")


class SearchMethod(str, Enum):
    search_r1 = "search_r1"
    evinote = "evinote"


class ExtractMethod(str, Enum):
    eviomni = "eviomni"
    lear = "lear"


class GraceStyle(str, Enum):
    bundled = "bundled"
    hotpotqa = "hotpotqa"
    qasper = "qasper"
    qa = "qa"  # answers only (FlashRAG JSONL, Search-R1 parquet): passages holding an answer are the gold


class GraceConstruction(str, Enum):
    balanced = "balanced"  # the paper's training set (§3.1)
    natural = "natural"  # the paper's test set (§4.3, Table 1)


# GRACE's k: 5 for constructing the training set (Appendix B.1), 3 for the test set (Table 1).
GRACE_K = {GraceConstruction.balanced: 5, GraceConstruction.natural: 3}
PAPER_TEST_SPLITS = "GRACE Table 1, Qwen3-Embedding-0.6B at k=3: HotpotQA 296 : 204, QASPER 1200 : 251"


# A retrieval server given by URL that does not answer: its client would retry each request for a minute first.
SERVER_FIX = "start it (verl-evidence serve --index-dir ...), or check the URL"


def at_least_one(**counts: int | None) -> None:
    """Counts given as options (``search_depth`` is ``--search-depth``) are 1 or more: checked before any work."""
    for name, value in counts.items():
        if value is not None and value < 1:
            raise typer.BadParameter(f"must be 1 or more, got {value}", param_hint=f"--{name.replace('_', '-')}")


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # Transient, and off when stderr is not a terminal (a log): an error is the one line left, and the counts
    # printed after each step say what the bars said.
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def _report(path: Path, rows: Sequence[dict]) -> None:
    console.print(f"wrote {len(rows)} rows to {path}")


def _report_written(path: Path, rows: int, summary: Path) -> None:
    console.print(f"wrote {rows} rows to {path}", soft_wrap=True)  # a path is not wrapped at 80 columns in a log
    console.print(f"summary: {summary}", soft_wrap=True)


@data_app.command("qa")
def qa_command(
    sources: list[str] = typer.Argument(
        ...,
        help="one or more of: 'bundled', a FlashRAG .jsonl, a Search-R1 .parquet; NAME=PATH gives that input "
        "the data source NAME (e.g. nq=nq/train.jsonl hotpotqa=hotpotqa/train.jsonl)",
        show_default=False,
    ),
    output: Path = typer.Option(..., "--output", "-o", help="parquet file to write"),
    method: SearchMethod = typer.Option(SearchMethod.search_r1, help="which searching method the rows are for"),
    data_source: str | None = typer.Option(None, help="data source of inputs not named NAME=PATH (FlashRAG files)"),
    split: str | None = typer.Option(
        None, help="extra_info.split; default: a verl-layout row keeps its own, other rows get 'train'"
    ),
    template: str | None = typer.Option(
        None, help="prompt template: file, packaged prompt name or default name (re-renders verl-layout prompts)"
    ),
    sample: int | None = typer.Option(
        None, help="keep N random rows per data source (all rows of a smaller one); the ids go in the summary"
    ),
    seed: int = typer.Option(0, help="seeds --sample"),
    new_data_source: bool = typer.Option(False, "--new-data-source", help="accept a data source name not yet known"),
) -> None:
    """Rows for the multi-turn search methods (Search-R1 baseline, EviNote-RAG), from one input or several.

    A parquet is read and written in record batches; rows already in verl's layout (Search-R1's files)
    keep their prompt, reward_model and extra_info and gain only what the search loop and rewards read.
    Per-data-source counts (and the ids --sample kept) are printed and written to <output stem>.summary.json.
    """
    from verl_evidence.dataprep import mix
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.records import UniqueIds
    from verl_evidence.dataprep.templates import load_template

    prompt_template = load_template(template or method.value)
    inputs = [mix.QAInput(mix.parse_input(spec, data_source), new_data_source) for spec in sources]
    keep = None
    if sample is not None:
        keep = mix.choose_rows([name for item in inputs for name in item.data_sources()], sample, seed)
    verl_schemas = [item.verl_schema for item in inputs if item.verl_schema is not None]
    across = UniqueIds("inputs") if len(inputs) > 1 else None  # each input checks its own rows
    available: Counter[str] = Counter()
    written: Counter[str] = Counter()
    sampled_ids: dict[str, list[str]] = {}
    position = kept = passed_through = 0
    parquet_rows = sum(item.num_rows for item in inputs if item.parquet is not None)
    with (
        rows_mod.RowWriter(output, rows_mod.search_row_schema(*verl_schemas)) as writer,
        _progress() as progress,
    ):
        task = progress.add_task("writing rows", total=parquet_rows or None, visible=bool(parquet_rows))
        for item in inputs:
            number = 0
            for batch in item.batches():
                rows = []
                for source_row in batch:
                    number += 1
                    record = source_row.record
                    if across is not None:
                        across.add(record, number, item.label)
                    available[record.data_source] += 1
                    position += 1
                    if keep is not None and position - 1 not in keep:
                        continue
                    rows.append(
                        rows_mod.search_row(
                            source_row, method.value, prompt_template, writer.rows + len(rows), split, bool(template)
                        )
                    )
                    written[record.data_source] += 1
                    if source_row.given is not None:
                        passed_through += 1
                        kept += rows_mod.keeps_given_prompt(source_row, method.value, template is not None)
                    if keep is not None:
                        sampled_ids.setdefault(record.data_source, []).append(record.id)
                writer.write(rows)
                if item.parquet is not None:
                    progress.advance(task, len(batch))
    if passed_through:
        console.print(
            f"rows already in verl's layout: kept {kept} prompts, rendered {passed_through - kept} "
            f"with the {template or method.value!r} template; kept reward_model and extra_info"
        )
    unread = sorted({c for item in inputs if item.parquet is not None for c in item.parquet.unread_columns})
    if unread:
        console.print(f"columns not read (not part of the rows): {', '.join(unread)}")
    _print_source_counts(available, written, sample)
    summary: dict = {
        "command": "data qa",
        "output": str(output),
        "method": method.value,
        "inputs": [
            {"path": item.label, "data_source": item.spec.data_source, "rows": item.num_rows} for item in inputs
        ],
        "rows": writer.rows,
        "data_sources": {name: {"rows": written[name], "available": available[name]} for name in available},
    }
    if sample is not None:
        summary["sample"] = {"per_data_source": sample, "seed": seed, "ids": sampled_ids}
    _report_written(output, writer.rows, mix.write_summary(output, summary))


def _print_source_counts(available: Counter, written: Counter, sample: int | None) -> None:
    from rich.table import Table

    table = Table(title="rows per data source")
    for column in ("data source", "rows", "of"):
        table.add_column(column, justify="left" if column == "data source" else "right")
    for name in available:
        table.add_row(name, str(written[name]), str(available[name]))
    table.add_row("total", str(sum(written.values())), str(sum(available.values())))
    console.print(table)
    if sample is not None:
        whole = [name for name in available if available[name] <= sample]
        if whole:
            console.print(f"kept every row of {', '.join(whole)} (no more than --sample {sample})")


def token_counter(tokenizer_path: str) -> Callable[[str], int]:
    """Counts text tokens with ``tokenizer_path``'s tokenizer; a Qwen2.5/Qwen3 family name (``qwen2.5``, ``qwen3``) or a
    model of theirs whose tokenizer is not on this machine counts with Qwen's vocabulary built offline. Says which."""
    from verl_evidence.local.qwen_tokenizer import describe_stand_in, qwen_tokenizer, stand_in_family

    family = stand_in_family(tokenizer_path)
    if family is not None:
        stand_in = qwen_tokenizer(family)  # built once per machine, loaded once per process
        console.print(describe_stand_in(family, tokenizer_path), soft_wrap=True, markup=False)
        return lambda text: len(stand_in(text, add_special_tokens=False)["input_ids"])
    from retrieval_server.user_errors import check_model_source

    check_model_source(tokenizer_path, "--tokenizer")  # one line now, not the hub's retries and message
    from transformers import AutoTokenizer

    from verl_evidence.dataprep.records import DataPrepError

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    except (OSError, ValueError) as err:
        reason = " ".join(str(err).split())  # transformers' reasons span lines
        raise DataPrepError(
            f"--tokenizer {tokenizer_path}: cannot load a tokenizer from it ({reason}); pass the policy's model "
            "directory (with its tokenizer.json) or its hub name"
        ) from err
    console.print(f"tokens counted with the tokenizer of {tokenizer_path}", soft_wrap=True, markup=False)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def read_passages_file(path: Path, records: Sequence[QARecord], topk: int) -> list[list[dict]]:
    """JSONL ``{"id": question id, "passages": [{"id", "contents"} | "Title\\ntext", ...]}``."""
    from verl_evidence.dataprep.records import DataPrepError, read_jsonl

    by_id: dict[str, list[dict]] = {}
    for number, row in enumerate(read_jsonl(path), start=1):
        if "id" not in row or "passages" not in row:
            raise DataPrepError(f"{path}:{number}: missing column id or passages")
        docs = [
            d if isinstance(d, dict) else {"id": f"{row['id']}-{n}", "contents": d}
            for n, d in enumerate(row["passages"])
        ]
        by_id[str(row["id"])] = docs[:topk]
    missing = [r.id for r in records if r.id not in by_id]
    if missing:
        raise DataPrepError(f"{path}: no passages for question id(s) {missing[:5]}")
    return [by_id[r.id] for r in records]


@data_app.command("eviomni")
def eviomni_command(
    source: str = typer.Argument(..., help="'bundled', a FlashRAG .jsonl or a Search-R1 .parquet"),
    output: Path = typer.Option(..., "--output", "-o"),
    tokenizer: str = typer.Option(
        ...,
        help="the policy's tokenizer (path or hub name; qwen2.5 / qwen3, or a Qwen2.5/Qwen3 model not on this "
        "machine: Qwen's vocabulary built offline): L_P is counted with it",
    ),
    method: ExtractMethod = typer.Option(ExtractMethod.eviomni),
    retrieval_url: str | None = typer.Option(None, help="retrieval server, e.g. http://127.0.0.1:8000"),
    passages_file: Path | None = typer.Option(None, help="JSONL of pre-retrieved passages per question id"),
    retriever: str | None = typer.Option(None, help="in-process retriever over --corpus: bm25 or dense"),
    corpus: str | None = typer.Option(None, help="FlashRAG corpus JSONL for --retriever ('bundled' works)"),
    dense_model: str | None = typer.Option(None, help="sentence-transformers model for --retriever dense"),
    topk: int = typer.Option(5, help="passages per question (paper: 5)"),
    data_source: str | None = typer.Option(None),
    split: str = typer.Option("train"),
    template: str | None = typer.Option(None),
    new_data_source: bool = typer.Option(False, "--new-data-source"),
) -> None:
    """Rows for EviOmni / LEAR: top-k passages per question in the prompt, L_P recorded."""
    from retrieval_server.user_errors import check_model_source, check_server_answers
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.records import DataPrepError, load_records
    from verl_evidence.dataprep.templates import load_template

    chosen = [x for x in (retrieval_url, passages_file, retriever) if x]
    if len(chosen) != 1:
        raise DataPrepError("give exactly one of --retrieval-url, --passages-file, --retriever")
    check_model_source(dense_model, "--dense-model")
    check_server_answers(retrieval_url, "--retrieval-url", "/health", SERVER_FIX)
    at_least_one(topk=topk)
    records = load_records(source, data_source, new_data_source)
    count_tokens = token_counter(tokenizer)
    if passages_file:
        passages = read_passages_file(passages_file, records, topk)
    else:
        fetch = _passage_fetcher(
            retrieval_url, retriever, corpus or ("bundled" if source == "bundled" else None), dense_model, topk
        )
        passages = []
        with _progress() as progress:
            task = progress.add_task("retrieving", total=len(records))
            for start in range(0, len(records), 32):
                batch = records[start : start + 32]
                passages.extend(fetch(batch))
                progress.advance(task, len(batch))
    rows = rows_mod.eviomni_rows(
        records, passages, load_template(template or method.value), split, count_tokens, method.value
    )
    _report(rows_mod.write_parquet(rows, output), rows)


def _passage_fetcher(
    retrieval_url: str | None, retriever: str | None, corpus: str | None, dense_model: str | None, topk: int
) -> Callable[[Sequence[QARecord]], list[list[dict]]]:
    """records -> top-k ``{"id", "contents"}`` per record, from the server or an in-process retriever."""
    from verl_evidence.dataprep.retrievers import Query, ServerRetriever, build_retriever

    if retrieval_url:
        server = ServerRetriever(retrieval_url)
        return lambda batch: server.passages([r.question for r in batch], topk)
    pool = _load_corpus(corpus)
    local = build_retriever(retriever, pool, dense_model=dense_model)

    def fetch(batch: Sequence[QARecord]) -> list[list[dict]]:
        ranked = local.retrieve([Query(r.id, r.question) for r in batch], topk)
        return [[{"id": i, "contents": pool[i]} for i in ids] for ids in ranked]

    return fetch


def _load_corpus(spec: str | None) -> dict[str, str]:
    from verl_evidence.dataprep.records import DataPrepError, bundled_paths, read_corpus

    if spec is None:
        raise DataPrepError("an in-process retriever needs --corpus (a FlashRAG corpus JSONL or 'bundled')")
    return read_corpus(bundled_paths()[1] if spec == "bundled" else spec)


def print_grace_stats(
    stats: grace_mod.GraceStats, retrievers: Sequence[str], construction: str, k: int, skipped: int = 0
) -> None:
    from rich.table import Table

    table = Table(title=f"GRACE {construction} construction, k={k}: {stats.samples} samples, {stats.total} kept")
    columns = ["retriever", "answerable", "unanswerable", "duplicates dropped"]
    if stats.skipped:
        columns.append("skipped")
    for column in columns:
        table.add_column(column, justify="right" if column != "retriever" else "left")
    counts = stats.as_dict(retrievers)
    kinds = ("answerable", "unanswerable", "duplicates", "skipped")[: len(columns) - 1]
    for name in retrievers:
        table.add_row(name, *(str(counts["retrievers"][name][kind]) for kind in kinds))
    table.add_row("total", *(str(counts["total"][kind]) for kind in kinds))
    console.print(table)
    if stats.skipped:
        console.print(
            "skipped: nothing retrieved, or (answers only) no retrieved passage holds an answer for an answerable "
            "context, or too few lack one for an unanswerable one"
        )
    total = counts["total"]
    line = f"split: {total['answerable']} answerable : {total['unanswerable']} unanswerable"
    if construction == "natural":
        line += f" ({PAPER_TEST_SPLITS})"
    console.print(line)
    if skipped:
        console.print(f"skipped {skipped} unanswerable or evidence-less input questions")


def default_retrievers(cross_encoder: str | None, natural: bool = False, annotated: bool = True) -> list[str]:
    """The paper's retrievers: all five for the training set (oracle only with gold passages, dense+rerank
    only with a cross-encoder), the dense one for the test set."""
    from verl_evidence.dataprep.retrievers import BUILTIN_RETRIEVERS

    if natural:
        return ["dense"]
    return [
        name
        for name in BUILTIN_RETRIEVERS
        if (name != "dense+rerank" or cross_encoder) and (name != "oracle" or annotated)
    ]


@data_app.command("grace")
def grace_command(
    source: str = typer.Argument(
        ...,
        help="'bundled', a bundled-layout .jsonl, a HotpotQA or a QASPER .json/.jsonl, "
        "or (--style qa) a FlashRAG .jsonl or a Search-R1 .parquet",
    ),
    output: Path = typer.Option(..., "--output", "-o"),
    style: GraceStyle | None = typer.Option(None, help="input layout; default: qa for a .parquet, else bundled"),
    retrievers: list[str] | None = typer.Option(
        None,
        "--retriever",
        help="built-in name or NAME=URL (retrieval server); repeatable. Default: balanced, the five built-ins "
        "(dense+rerank only with --cross-encoder, oracle only with gold passages); natural, dense",
    ),
    construction: GraceConstruction | None = typer.Option(
        None,
        help="balanced: 50/50 per retriever, gold forced in or out (the paper's training set); natural: the "
        "top-k as retrieved, answerable iff the gold was (its test set). Default: balanced for --split train, "
        "natural for val/validation/dev/test",
    ),
    k: int | None = typer.Option(None, "--k", help="passages per context; default 5 balanced, 3 natural"),
    seed: int = typer.Option(0, help="seeds the per-retriever 50/50 split, the fillers and --sample"),
    sample: int | None = typer.Option(None, help="keep N random questions per data source (the ids go in the summary)"),
    search_depth: int = typer.Option(
        20, help="--style qa: passages retrieved per question to find one holding an answer, and distractors"
    ),
    dense_model: str | None = typer.Option(None, help="sentence-transformers model for dense retrievers"),
    cross_encoder: str | None = typer.Option(None, help="cross-encoder for dense+rerank"),
    rerank_depth: int = typer.Option(20, help="dense shortlist length re-ordered by the cross-encoder"),
    corpus: str | None = typer.Option(
        None, help="corpus JSONL: a bundled-layout QA file's; --style qa: for in-process retrievers"
    ),
    per_question_pool: bool = typer.Option(
        True,
        "--per-question-pool/--file-pool",
        help="HotpotQA: retrieve only among the question's own paragraphs (as the authors' released code), or "
        "among every paragraph of the file",
    ),
    data_source: str | None = typer.Option(None),
    split: str = typer.Option("train"),
    template: str | None = typer.Option(
        None, help="prompt: a packaged name or a file (default grace; grace_three_shot[_tags]: Table 4's baselines)"
    ),
    new_data_source: bool = typer.Option(False, "--new-data-source"),
    sft: bool = typer.Option(
        False,
        "--sft",
        help="write the SFT baseline's chat rows (Appendix B.3: gold evidence and answer, or the fixed refusal, as "
        "the assistant turn; verl's SFT trainer reads their 'messages') instead of RL rows",
    ),
) -> None:
    """GRACE rows: the balanced training set from several retrievers, or the natural test set.

    Counts per retriever are printed and written to <output stem>.summary.json.
    """
    from retrieval_server.user_errors import check_model_source, check_server_answers
    from verl_evidence.dataprep import grace as grace_mod
    from verl_evidence.dataprep import mix
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.records import (
        DataPrepError,
        bundled_paths,
        check_references,
        load_records,
        read_corpus,
        read_flashrag_jsonl,
    )
    from verl_evidence.dataprep.retrievers import build_retriever
    from verl_evidence.dataprep.templates import load_template

    check_model_source(dense_model, "--dense-model")
    check_model_source(cross_encoder, "--cross-encoder")
    at_least_one(k=k, sample=sample, search_depth=search_depth, rerank_depth=rerank_depth)
    for spec in retrievers or []:  # NAME=URL: a retrieval server, asked once before any question is
        name, _, url = spec.partition("=")
        if url.startswith(("http://", "https://")):
            check_server_answers(url, f"--retriever {name}:", "/health", SERVER_FIX)
    style = style or (GraceStyle.qa if source.endswith(".parquet") else GraceStyle.bundled)
    if construction is None:
        validating = split.lower() in rows_mod.VALIDATION_SPLITS
        construction = GraceConstruction.natural if validating else GraceConstruction.balanced
    natural = construction is GraceConstruction.natural
    k = GRACE_K[construction] if k is None else k
    skipped = 0
    corpus_name = f"the paragraphs of {source}"
    if style is GraceStyle.bundled:
        if source == "bundled":
            qa_path, corpus_path = bundled_paths()
        elif corpus is None:
            raise DataPrepError("a QA file in the bundled layout needs its corpus: pass --corpus corpus.jsonl")
        else:
            qa_path, corpus_path = Path(source), Path(corpus)
        records = read_flashrag_jsonl(qa_path, data_source or "bundled", new_data_source)
        passages = read_corpus(corpus_path)
        corpus_name = str(corpus_path)
        check_references(records, passages, str(qa_path))
        items = [grace_mod.GraceInput(r) for r in records]
    elif style is GraceStyle.hotpotqa:
        items, passages = grace_mod.read_hotpotqa(source, data_source or "hotpotqa", new_data_source, per_question_pool)
    elif style is GraceStyle.qasper:
        items, passages, skipped = grace_mod.read_qasper(source, data_source or "qasper", new_data_source)
    else:
        items = [grace_mod.GraceInput(r) for r in load_records(source, data_source, new_data_source)]
        passages = read_corpus(corpus) if corpus else {}
        corpus_name = corpus or "the served corpus"
        if not retrievers and not corpus:
            raise DataPrepError(
                "questions with answers only are labelled by what a retriever returns: pass --retriever NAME=URL "
                "(a retrieval server, e.g. dense=http://127.0.0.1:8000) or --corpus FILE for in-process retrievers"
            )
    if not items:
        raise DataPrepError(f"{source}: no usable samples")
    if sample is not None:
        chosen = mix.choose_rows([item.record.data_source for item in items], sample, seed)
        items = [item for position, item in enumerate(items) if position in chosen]
    by_answer = style is GraceStyle.qa
    cache: dict = {}
    built = [
        build_retriever(
            spec,
            passages,
            seed=seed,
            dense_model=dense_model,
            cross_encoder=cross_encoder,
            rerank_depth=rerank_depth,
            cache=cache,
            corpus_name=corpus_name,
            served_corpus=by_answer and not corpus,
        )
        for spec in retrievers or default_retrievers(cross_encoder, natural, annotated=not by_answer)
    ]
    names = [r.name for r in built]
    with _progress() as progress:
        tasks = {r.name: progress.add_task(f"{r.name:>14}", total=len(items)) for r in built}
        examples, stats = grace_mod.construct(
            items,
            built,
            passages,
            k,
            seed,
            progress=lambda name, n: progress.advance(tasks[name], n),
            natural=natural,
            by_answer=by_answer,
            search_depth=search_depth,
        )
    print_grace_stats(stats, names, construction.value, k, skipped)
    if sft:
        rows = grace_mod.sft_rows(examples, passages, load_template(template or "grace"))
        grace_mod.write_sft_parquet(rows, output)
    else:
        rows = rows_mod.grace_rows(examples, passages, load_template(template or "grace"), split)
        rows_mod.write_parquet(rows, output)
    summary = {
        "command": "data grace --sft" if sft else "data grace",
        "output": str(output),
        "source": source,
        "style": style.value,
        "construction": construction.value,
        "k": k,
        "seed": seed,
        "split": split,
        "retrievers": list(retrievers or names),
        "rows": len(rows),
        "counts": stats.as_dict(names),
    }
    if sample is not None:
        ids: dict[str, list[str]] = {}
        for item in items:
            ids.setdefault(item.record.data_source, []).append(item.record.id)
        summary["sample"] = {"per_data_source": sample, "seed": seed, "ids": ids}
    _report_written(output, len(rows), mix.write_summary(output, summary))


@data_app.command("inspect")
def inspect_command(path: Path, limit: int = typer.Option(1, help="rows to print")) -> None:
    """Print the first rows of a prepared parquet file as JSON."""
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.records import DataPrepError

    if not path.is_file():
        raise DataPrepError(f"{path}: no such file")
    try:
        rows = rows_mod.read_parquet(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise DataPrepError(f"{path}: not a parquet file of rows ({err}); give one `verl-evidence data` wrote") from err
    for row in rows[:limit]:
        typer.echo(json.dumps(row, indent=2, ensure_ascii=False, default=str))
