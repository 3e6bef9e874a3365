"""The papers' main results tables, transcribed: the reference rows of ``verl-evidence eval --paper``.

Numbers are copied from the papers exactly as printed, in the papers' own scale
(EviOmni, LEAR and GRACE in percent, EviNote as fractions) and in the papers'
column order. A value the paper prints as "-" is ``None``. Each table is kept
as text in the paper's own reading order (one line per printed line), so it can
be checked against the PDF line by line; :func:`paper_layout` parses it.

- EviOmni, Table 2 (and LEAR, Table 4, the same numbers): rows are data sets x
  metrics and methods are columns in the paper; here each method and model size
  is a row, so that a user's checkpoints are rows beside them.
- EviNote-RAG, Table 1: methods x data sets, F1 before EM in each data set.
- GRACE, Table 1: methods x (QASPER, HotpotQA), each with answerable EM,
  BERTScore F1 and LLM-judge accuracy (LJ), unanswerable accuracy and LJ, and
  overall Acc. and B. Acc. (the paper's Acc. and B. Acc. are computed from the
  LJ verdicts: e.g. Qwen3-4B on QASPER, (1200 x 78.83 + 251 x 42.23) / 1451 = 72.50).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PAPERS", "PaperLayout", "ReferenceRow", "paper_layout"]


@dataclass(frozen=True)
class ReferenceRow:
    """One method's reported numbers: ``values[source][measure]`` in the paper's scale."""

    label: str
    group: str
    values: dict[str, dict[str, float | None]]


@dataclass(frozen=True)
class PaperLayout:
    """What ``eval --paper NAME`` prints: the paper's table, its columns and reference rows.

    ``measures`` are keys of :func:`verl_evidence.eval.metrics.summarize` (or of the
    paper-specific measures in :mod:`verl_evidence.eval.paper_table`), ``measure_labels``
    the paper's column names; ``scale`` turns our fractions into the paper's unit.
    """

    name: str
    paper: str
    table: str
    family: str
    sources: tuple[str, ...]
    measures: tuple[str, ...]
    measure_labels: dict[str, str]
    scale: float
    digits: int
    reference: list[ReferenceRow] = field(default_factory=list)
    notes: tuple[str, ...] = ()


def _number(text: str) -> float | None:
    text = text.strip()
    if text in ("-", ""):
        return None
    return float(text.rstrip("x×"))


# ---------------------------------------------------------------------------
# EviOmni, Table 2 (seeds/000) = LEAR, Table 4 (seeds/001). One line per printed line:
# size | data set | metric | Zero | Full | SeleCtx | LLMLingua-2 | RECOMP | FilCo | SEER | CoT | EviOmni (LEAR)
# ---------------------------------------------------------------------------
_RATIONAL_METHODS = ("Zero", "Full", "SeleCtx", "LLMLingua-2", "RECOMP", "FilCo", "SEER", "CoT")
_RATIONAL_GROUPS = {"1.5B": "1.5B size model", "7B": "7B size model"}
_RATIONAL_TABLE = """
1.5B | nq       | EM | 13.74 | 41.97 | 24.68 | 29.36 | 37.40 | 36.62 | 36.93 | 37.70 | 41.14
1.5B | nq       | F1 | 53.16 | 70.07 | 59.52 | 62.82 | 67.18 | 66.63 | 67.11 | 68.09 | 70.77
1.5B | nq       | CR | -     | 1.0x  | 3.44x | 4.51x | 5.43x | 16.3x | 13.2x | 4.56x | 38.1x
1.5B | triviaqa | EM | 29.10 | 57.02 | 45.13 | 48.67 | 56.56 | 54.06 | 54.57 | 54.29 | 56.84
1.5B | triviaqa | F1 | 64.62 | 80.13 | 73.40 | 75.29 | 79.85 | 78.56 | 78.81 | 79.56 | 80.85
1.5B | triviaqa | CR | -     | 1.0x  | 3.38x | 4.52x | 5.35x | 8.55x | 10.3x | 5.02x | 38.8x
1.5B | hotpotqa | EM | 12.36 | 19.20 | 15.30 | 16.64 | 18.52 | 18.18 | 18.60 | 19.52 | 20.46
1.5B | hotpotqa | F1 | 48.52 | 53.04 | 49.65 | 51.26 | 52.92 | 52.15 | 52.79 | 53.43 | 54.20
1.5B | hotpotqa | CR | -     | 1.0x  | 3.40x | 4.52x | 5.44x | 18.3x | 15.5x | 4.17x | 33.0x
7B   | nq       | EM | 25.04 | 48.78 | 33.91 | 36.51 | 43.77 | 44.79 | 45.01 | 44.49 | 46.95
7B   | nq       | F1 | 60.88 | 74.40 | 65.71 | 67.77 | 71.61 | 72.30 | 72.76 | 73.09 | 73.99
7B   | nq       | CR | -     | 1.0x  | 3.44x | 4.51x | 5.43x | 15.4x | 12.4x | 3.36x | 17.9x
7B   | triviaqa | EM | 47.31 | 65.34 | 58.72 | 60.50 | 64.40 | 63.46 | 64.20 | 63.91 | 64.76
7B   | triviaqa | F1 | 74.36 | 84.83 | 80.95 | 81.94 | 84.12 | 83.66 | 84.14 | 84.45 | 84.74
7B   | triviaqa | CR | -     | 1.0x  | 3.38x | 4.52x | 5.35x | 7.77x | 9.70x | 3.33x | 17.6x
7B   | hotpotqa | EM | 17.95 | 25.82 | 21.27 | 23.45 | 24.84 | 25.27 | 25.81 | 27.25 | 28.02
7B   | hotpotqa | F1 | 53.07 | 58.50 | 54.90 | 56.65 | 58.02 | 58.15 | 58.63 | 59.84 | 60.30
7B   | hotpotqa | CR | -     | 1.0x  | 3.40x | 4.52x | 5.44x | 17.5x | 14.3x | 3.32x | 16.5x
"""
_RATIONAL_MEASURES = {"EM": "em", "F1": "f1", "CR": "compression_ratio"}


def _rational_rows(method: str, table: str) -> list[ReferenceRow]:
    """Reference rows of EviOmni's Table 2 / LEAR's Table 4 (methods as rows, one per model size)."""
    methods = (*_RATIONAL_METHODS, method)
    values: dict[tuple[str, str], dict[str, dict[str, float | None]]] = {}
    for line in _RATIONAL_TABLE.strip().splitlines():
        size, source, metric, *numbers = (cell.strip() for cell in line.split("|"))
        if len(numbers) != len(methods):
            raise ValueError(f"{table}: {line!r} has {len(numbers)} values for {len(methods)} methods")
        for name, number in zip(methods, numbers):
            values.setdefault((size, name), {}).setdefault(source, {})[_RATIONAL_MEASURES[metric]] = _number(number)
    return [
        ReferenceRow(f"[{table}] {name} ({size})", _RATIONAL_GROUPS[size], per_source)
        for (size, name), per_source in values.items()
    ]


# ---------------------------------------------------------------------------
# EviNote-RAG, Table 1 (seeds/002). ## section, then: method | F1 EM of TriviaQA, 2Wiki, Bamboogle, Musique,
# PopQA, NQ, HotpotQA
# ---------------------------------------------------------------------------
_EVINOTE_SOURCES = ("triviaqa", "2wikimultihopqa", "bamboogle", "musique", "popqa", "nq", "hotpotqa")
_EVINOTE_TABLE = """
## Foundational Model
Direct Inference           | 0.321 0.298 0.264 0.228 0.221 0.216 0.085 0.074 0.170 0.150 0.198 0.134 0.244 0.216
RAG Workflow               | 0.456 0.442 0.244 0.232 0.254 0.240 0.100 0.094 0.479 0.458 0.420 0.376 0.371 0.330
## CoT
ReCAT                      | 0.474 0.438 0.482 0.336 0.272 0.184 0.192 0.118 0.367 0.308 0.495 0.454 0.421 0.380
IRCoT                      | 0.432 0.418 0.492 0.417 0.245 0.112 0.192 0.102 0.322 0.287 0.512 0.470 0.435 0.392
## Prompt-Based Agentic RAG
Self-Ask                   | 0.392 0.362 0.336 0.278 0.332 0.320 0.260 0.214 0.410 0.398 0.471 0.423 0.410 0.365
Iter-RetGen                | 0.374 0.356 0.326 0.270 0.232 0.160 0.178 0.118 0.376 0.348 0.442 0.395 0.390 0.342
Self-RAG                   | 0.451 0.436 0.432 0.391 0.351 0.256 0.192 0.183 0.332 0.314 0.508 0.465 0.448 0.402
CR-Planner                 | 0.417 0.403 0.473 0.452 0.434 0.304 0.271 0.202 0.351 0.350 0.520 0.482 0.452 0.405
Search-o1                  | 0.589 0.566 0.286 0.272 0.358 0.328 0.168 0.140 0.369 0.336 0.345 0.310 0.330 0.268
## RL-Based Agentic RAG
ReARTeR                    | 0.468 0.506 0.554 0.534 0.119 0.096 0.296 0.237 0.432 0.422 0.545 0.502 0.512 0.465
R1-Searcher                | 0.731 0.688 0.491 0.446 0.201 0.176 0.228 0.214 0.427 0.413 0.538 0.492 0.498 0.451
Search-R1                  | 0.754 0.694 0.280 0.244 0.377 0.320 0.274 0.184 0.498 0.482 0.550 0.508 0.464 0.420
EviNote-RAG (Ours)         | 0.795 0.730 0.536 0.494 0.528 0.424 0.336 0.240 0.491 0.480 0.563 0.524 0.557 0.490
"""


def _sections(table: str) -> list[tuple[str, str, list[str]]]:
    """``(section, method, numbers)`` of a table written as ``## section`` lines and ``method | n n n`` lines."""
    out, section = [], ""
    for line in table.strip().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        method, numbers = line.split("|")
        out.append((section, method.strip(), numbers.split()))
    return out


def _evinote_rows() -> list[ReferenceRow]:
    rows = []
    for group, method, numbers in _sections(_EVINOTE_TABLE):
        if len(numbers) != 2 * len(_EVINOTE_SOURCES):
            raise ValueError(f"Table 1: {method} has {len(numbers)} values")
        values = {
            source: {"f1": _number(numbers[2 * i]), "em": _number(numbers[2 * i + 1])}
            for i, source in enumerate(_EVINOTE_SOURCES)
        }
        rows.append(ReferenceRow(f"[Table 1] {method}", group, values))
    return rows


# ---------------------------------------------------------------------------
# GRACE, Table 1 (seeds/004; retrieval by Qwen3-Embedding-0.6B, k = 3). ## section, then: method | for QASPER,
# then HotpotQA: answerable EM, F1 (BERTScore), LJ | unanswerable Acc., LJ | overall Acc., B. Acc.
# ---------------------------------------------------------------------------
_GRACE_SOURCES = ("qasper", "hotpotqa")
_GRACE_MEASURES = (
    "answerable_em",
    "bertscore_f1",
    "judge_answerable",
    "refusal_accuracy",
    "judge_unanswerable",
    "judge_accuracy",
    "judge_balanced_accuracy",
)
_GRACE_TABLE = """
## Prompt based
Qwen3-4B                   | 0.0   50.23 78.83 5.58  42.23 72.50 60.53 17.57 54.31 89.53 16.18 60.78 77.80 75.16
Llama3-8B-Instruct         | 1.33  54.60 70.58 12.75 30.68 63.68 50.63 8.78  39.15 27.36 48.53 89.22 52.60 58.29
DeepSeek-chat              | 0.0   51.88 69.33 50.60 72.11 69.81 69.57 33.45 60.46 68.92 75.00 75.98 71.80 72.45
SuRe on Qwen3-4B           | 5.92  52.43 46.17 0.0   0.40  38.25 23.28 26.35 63.62 65.54 0.0   1.47  39.40 33.51
SuRe on Llama3-8B-Instruct | 5.25  55.01 54.83 0.0   1.59  45.62 28.21 35.14 69.18 83.11 0.0   0.0   49.20 41.55
SuRe on DeepSeek-chat      | 13.08 58.68 57.92 0.0   7.17  49.14 32.54 51.69 78.49 84.12 0.0   0.98  50.20 42.55
## SFT based
Qwen3-4B                   | 28.92 69.53 62.25 67.33 67.33 63.13 64.79 64.53 84.77 84.12 44.12 44.12 67.80 64.12
Llama3-8B-Instruct         | 27.92 70.21 62.75 62.95 62.95 62.78 62.85 67.23 86.38 87.50 49.51 50.49 72.40 69.00
## RL based
TrustAlign-3B†             | 0.0   41.20 41.17 78.09 80.88 48.04 61.03 0.0   38.66 44.59 55.88 67.16 53.80 55.88
TrustAlign on Qwen3-4B     | 0.0   44.50 36.83 0.0   60.96 41.01 48.90 0.0   32.27 11.49 0.0   96.57 46.20 54.03
TrustAlign-7B†             | 0.0   43.63 33.67 0.0   88.45 43.14 38.41 0.0   34.02 24.32 0.0   86.76 49.80 55.54
TrustAlign-8B†             | 0.08  34.72 9.67  97.61 97.61 24.88 53.64 0.0   30.57 22.64 88.73 88.73 49.60 55.69
ARENA on Qwen3-4B          | 23.25 68.08 73.50 19.92 20.72 64.37 47.11 64.86 86.05 90.54 38.73 38.73 69.40 64.64
ARENA-7B†                  | 22.50 69.73 69.67 4.78  7.97  58.99 38.82 65.54 86.27 88.18 5.88  9.31  55.60 48.75
ARENA-8B†                  | 23.58 68.66 69.17 0.0   0.40  57.27 34.79 64.53 85.43 87.84 0.0   0.0   52.00 43.92
## Agentic Models
R1-Searcher-7B†            | 15.42 59.80 48.83 17.13 19.92 43.83 34.38 51.35 74.59 69.59 65.20 65.20 67.80 67.40
Search-R1-7B†              | 18.50 64.76 61.00 30.68 33.07 56.17 47.03 56.08 79.49 78.72 47.55 47.55 66.00 63.13
SimpleDeepSearcher-7B†     | 22.92 67.13 67.17 16.73 17.93 58.65 42.55 45.61 68.47 63.18 64.71 64.71 63.80 63.94
## Our methods
GRACE-Qwen3-4B             | 27.08 73.09 74.25 74.90 74.90 74.36 74.58 65.20 84.95 91.55 66.18 66.18 81.20 78.87
GRACE-Llama3.1-8B          | 27.08 72.02 70.08 74.50 74.50 70.85 72.29 65.20 86.40 88.85 42.16 44.61 70.80 66.73
"""


def _grace_rows() -> list[ReferenceRow]:
    rows = []
    width = len(_GRACE_MEASURES)
    for group, method, numbers in _sections(_GRACE_TABLE):
        if len(numbers) != width * len(_GRACE_SOURCES):
            raise ValueError(f"Table 1: {method} has {len(numbers)} values")
        values = {
            source: dict(zip(_GRACE_MEASURES, map(_number, numbers[i * width : (i + 1) * width])))
            for i, source in enumerate(_GRACE_SOURCES)
        }
        label = f"[Table 1] {method}" if group != "SFT based" else f"[Table 1] SFT {method}"
        rows.append(ReferenceRow(label, group, values))
    return rows


_RATIONAL_LABELS = {"em": "EM", "f1": "F1", "compression_ratio": "CR"}
_RATIONAL_NOTES = (
    "EM/F1 of the user's rows: the separate reader's answer from the extracted evidence (eval --reader), as the "
    "paper scores it (a QA generator tuned with LoRA rank 8); without --reader, the policy's own answer o_f.",
    "CR: sum of the retrieved passages' tokens over the evidence's tokens (higher: more compression).",
    "The paper prints methods as columns and data sets x metrics as rows; here every method is a row.",
)

PAPERS: dict[str, dict] = {
    "eviomni": {
        "paper": "EviOmni (Learning to Extract Rational Evidence via RL for RAG)",
        "table": "Table 2",
        "family": "eviomni",
        "sources": ("nq", "triviaqa", "hotpotqa"),
        "measures": ("em", "f1", "compression_ratio"),
        "measure_labels": _RATIONAL_LABELS,
        "scale": 100.0,
        "digits": 2,
        "rows": lambda: _rational_rows("EviOmni", "Table 2"),
        "notes": _RATIONAL_NOTES,
    },
    "lear": {
        "paper": "LEAR (Learning to Extract Rational Evidence via RL for RAG)",
        "table": "Table 4",
        "family": "eviomni",
        "sources": ("nq", "triviaqa", "hotpotqa"),
        "measures": ("em", "f1", "compression_ratio"),
        "measure_labels": _RATIONAL_LABELS,
        "scale": 100.0,
        "digits": 2,
        "rows": lambda: _rational_rows("LEAR", "Table 4"),
        "notes": _RATIONAL_NOTES,
    },
    "evinote": {
        "paper": "EviNote-RAG (Enhancing RAG Models via Answer-Supportive Evidence Notes)",
        "table": "Table 1",
        "family": "search",
        "sources": _EVINOTE_SOURCES,
        "measures": ("f1", "em"),
        "measure_labels": {"f1": "F1", "em": "EM"},
        "scale": 1.0,
        "digits": 3,
        "rows": _evinote_rows,
        "notes": (
            "The paper tests 500 random questions per data set (Bamboogle: all 125): `verl-evidence data qa "
            "--sample N --seed S`.",
        ),
    },
    "grace": {
        "paper": "GRACE (Grounded Response and Abstention under Contextual Evidence)",
        "table": "Table 1",
        "family": "grace",
        "sources": _GRACE_SOURCES,
        "measures": _GRACE_MEASURES,
        "measure_labels": {
            "answerable_em": "Ans EM",
            "bertscore_f1": "Ans F1",
            "judge_answerable": "Ans LJ",
            "refusal_accuracy": "Una Acc",
            "judge_unanswerable": "Una LJ",
            "judge_accuracy": "Acc",
            "judge_balanced_accuracy": "B.Acc",
        },
        "scale": 100.0,
        "digits": 2,
        "rows": _grace_rows,
        "notes": (
            "Ans: answerable questions (gold evidence retrieved); Una: unanswerable. The paper's test sets hold "
            "QASPER 1200:251 and HotpotQA 296:204 (answerable:unanswerable), retrieved by Qwen3-Embedding-0.6B, k = 3.",
            "Ans F1 is BERTScore F1 (bert-base-uncased in the paper; eval --bertscore). LJ: the LLM judge "
            "(DeepSeek-V3.2-chat in the paper; eval --judge). Una Acc: refusals by the <llm> path.",
            "Acc and B.Acc are the paper's overall and balanced accuracy over the LJ verdicts; a user's row judged "
            "without --judge shows them from exact match instead, marked (EM) in its label.",
            "† in a label: the authors' released checkpoint of that method.",
        ),
    },
}


def paper_layout(name: str) -> PaperLayout:
    """The layout and reference rows of ``--paper NAME`` (``eviomni``, ``lear``, ``evinote`` or ``grace``)."""
    if name not in PAPERS:
        raise ValueError(f"unknown paper {name!r}; choose from {', '.join(PAPERS)}")
    spec = dict(PAPERS[name])
    rows = spec.pop("rows")()
    return PaperLayout(name=name, reference=rows, **spec)
