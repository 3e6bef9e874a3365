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

__all__ = ["ABLATION_TABLES", "PAPERS", "PaperLayout", "ReferenceRow", "available_tables", "paper_layout"]


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
    average: bool = False  # an Avg column (the paper's own Average for reference rows)
    noise_series: bool = False  # rows per number of added irrelevant passages (eval --noise-passages)


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


PAPERS_EVIOMNI_TITLE = PAPERS["eviomni"]["paper"]
PAPERS_LEAR_TITLE = PAPERS["lear"]["paper"]
PAPERS_EVINOTE_TITLE = PAPERS["evinote"]["paper"]
PAPERS_GRACE_TITLE = PAPERS["grace"]["paper"]

# ---------------------------------------------------------------------------
# The ablation tables (``eval --paper NAME --table N``), transcribed as the main ones. Rows shared with another
# table (Base = Search-R1 of EviNote's Table 1, SEN + EQR = EviNote-RAG; EviOmni's all-three row = EviOmni 1.5B EM
# of Table 2; GRACE = GRACE-Qwen3-4B of Table 1) are transcribed again, not copied: the tests compare them.
# ---------------------------------------------------------------------------
# EviNote-RAG, Tables 2-5 (seeds/002; Table 2 in §4.6, Tables 3-5 in Appendices A-C): rows as Table 1's.
_EVINOTE_ABLATIONS = {
    "2": """
## Ablation (Table 2)
Base                       | 0.754 0.694 0.280 0.244 0.377 0.320 0.274 0.184 0.498 0.482 0.550 0.508 0.464 0.420
+ Force Summary            | 0.708 0.638 0.334 0.304 0.338 0.224 0.274 0.184 0.472 0.454 0.505 0.450 0.423 0.362
+ Naive Summary            | 0.774 0.712 0.462 0.424 0.496 0.384 0.280 0.204 0.500 0.488 0.551 0.502 0.560 0.498
+ SEN                      | 0.795 0.730 0.505 0.464 0.440 0.352 0.317 0.210 0.524 0.514 0.563 0.518 0.550 0.482
+ SEN + EQR (Ours)         | 0.795 0.730 0.536 0.494 0.528 0.424 0.336 0.240 0.491 0.480 0.563 0.524 0.557 0.490
""",
    "3": """
## Summary strategies (Table 3)
Base                       | 0.754 0.694 0.280 0.244 0.377 0.320 0.274 0.184 0.498 0.482 0.550 0.508 0.464 0.420
+ NS                       | 0.774 0.712 0.462 0.424 0.496 0.384 0.280 0.204 0.500 0.488 0.551 0.502 0.560 0.498
+ NE                       | 0.773 0.710 0.460 0.422 0.494 0.382 0.281 0.206 0.501 0.486 0.552 0.503 0.559 0.497
+ FS                       | 0.708 0.638 0.334 0.304 0.338 0.224 0.274 0.184 0.472 0.454 0.505 0.450 0.423 0.362
+ SEN                      | 0.795 0.730 0.505 0.464 0.440 0.352 0.317 0.210 0.524 0.514 0.563 0.518 0.550 0.482
""",
    "4": """
## Reward shaping (Table 4)
Base                       | 0.754 0.694 0.280 0.244 0.377 0.320 0.274 0.184 0.498 0.482 0.550 0.508 0.464 0.420
+ FS                       | 0.708 0.638 0.334 0.304 0.338 0.224 0.274 0.184 0.472 0.454 0.505 0.450 0.423 0.362
+ FS + SR                  | 0.752 0.690 0.410 0.398 0.328 0.296 0.276 0.188 0.514 0.502 0.546 0.500 0.460 0.402
+ FS + EQR                 | 0.766 0.704 0.426 0.414 0.224 0.208 0.274 0.184 0.528 0.518 0.551 0.510 0.464 0.408
+ SEN                      | 0.795 0.730 0.505 0.464 0.440 0.352 0.317 0.210 0.524 0.514 0.563 0.518 0.550 0.482
+ SEN + EQR                | 0.795 0.730 0.536 0.494 0.528 0.424 0.336 0.240 0.491 0.480 0.563 0.524 0.557 0.490
""",
    # The text of Table 5 we transcribe from holds only the first 7 numbers of its last two rows; "-" stands for the
    # lost ones (the 7 kept equal Table 4's same rows).
    "5": """
## Joint effects (Table 5)
Base                       | 0.754 0.694 0.280 0.244 0.377 0.320 0.274 0.184 0.498 0.482 0.550 0.508 0.464 0.420
+ NS                       | 0.774 0.712 0.462 0.424 0.496 0.384 0.280 0.204 0.500 0.488 0.551 0.502 0.560 0.498
+ FS                       | 0.708 0.638 0.334 0.304 0.338 0.224 0.274 0.184 0.472 0.454 0.505 0.450 0.423 0.362
+ FS + SR                  | 0.752 0.690 0.410 0.398 0.328 0.296 0.276 0.188 0.514 0.502 0.546 0.500 0.460 0.402
+ FS + EQR                 | 0.766 0.704 0.426 0.414 0.224 0.208 0.274 0.184 0.528 0.518 0.551 0.510 0.464 0.408
+ SEN                      | 0.795 0.730 0.505 0.464 0.440 0.352 0.317 -     -     -     -     -     -     -
+ SEN + EQR                | 0.795 0.730 0.536 0.494 0.528 0.424 0.336 -     -     -     -     -     -     -
""",
}
# Which recipe setting trains each EviNote ablation row (recipes/evinote_grpo.sh ABLATION=...; Base is Search-R1).
EVINOTE_ABLATION_SETTINGS = {
    "Base": "recipes/search_r1_baseline.sh",
    "+ Force Summary": "ABLATION=force_summary",
    "+ FS": "ABLATION=force_summary",
    "+ Naive Summary": "ABLATION=naive_summary",
    "+ NS": "ABLATION=naive_summary",
    "+ NE": "ABLATION=naive_evidence",
    "+ FS + SR": "ABLATION=force_summary_sr",
    "+ FS + EQR": "ABLATION=force_summary_eqr",
    "+ SEN": "ABLATION=sen",
    "+ SEN + EQR": "(the default)",
    "+ SEN + EQR (Ours)": "(the default)",
}


def _evinote_ablation_rows(table: str) -> list[ReferenceRow]:
    rows = []
    for group, method, numbers in _sections(_EVINOTE_ABLATIONS[table]):
        if len(numbers) != 2 * len(_EVINOTE_SOURCES):
            raise ValueError(f"Table {table}: {method} has {len(numbers)} values")
        values = {
            source: {"f1": _number(numbers[2 * i]), "em": _number(numbers[2 * i + 1])}
            for i, source in enumerate(_EVINOTE_SOURCES)
        }
        rows.append(ReferenceRow(f"[Table {table}] {method}", group, values))
    return rows


# EviOmni, Table 4 (seeds/000) = LEAR, Table 6 (seeds/001): EM of the 1.5B model trained on each combination of
# answer rewards. One line per printed line: data set | Rationale | Evidence | Full Ctx | Evidence+Rationale |
# Evidence+Full Ctx | Evidence+Rationale+Full Ctx. The "Average" line is the paper's own.
_ANSWER_REWARD_ROWS = (
    ("Rationale", "rationale"),
    ("Evidence", "evidence"),
    ("Full Ctx", "full"),
    ("Evidence+Rationale", "rationale,evidence"),
    ("Evidence+Full Ctx", "evidence,full"),
    ("Evidence+Rationale+Full Ctx", "rationale,evidence,full"),
)
_ANSWER_REWARD_TABLES = {
    "eviomni": """
nq       | 39.89 40.27 39.53 40.02 40.44 41.14
triviaqa | 56.97 57.38 56.17 57.31 57.26 56.84
hotpotqa | 20.30 19.73 20.13 20.34 20.23 20.46
avg      | 39.05 39.13 38.61 39.22 39.31 39.48
""",
    # LEAR prints the same numbers, except the Rationale average: 38.72 (the mean of its three values is 39.05,
    # EviOmni's figure; the tests pin the difference).
    "lear": """
nq       | 39.89 40.27 39.53 40.02 40.44 41.14
triviaqa | 56.97 57.38 56.17 57.31 57.26 56.84
hotpotqa | 20.30 19.73 20.13 20.34 20.23 20.46
avg      | 38.72 39.13 38.61 39.22 39.31 39.48
""",
}


def _answer_reward_rows(paper: str, table: str) -> list[ReferenceRow]:
    values: dict[str, dict[str, dict[str, float | None]]] = {label: {} for label, _ in _ANSWER_REWARD_ROWS}
    for line in _ANSWER_REWARD_TABLES[paper].strip().splitlines():
        source, numbers = (part.strip() for part in line.split("|"))
        numbers = numbers.split()
        if len(numbers) != len(_ANSWER_REWARD_ROWS):
            raise ValueError(f"{table}: {line!r} has {len(numbers)} values")
        for (label, _), number in zip(_ANSWER_REWARD_ROWS, numbers):
            values[label][source] = {"em": _number(number)}
    return [
        ReferenceRow(f"[{table}] {label} (answer_rewards={setting})", "1.5B size model", values[label])
        for label, setting in _ANSWER_REWARD_ROWS
    ]


# GRACE, Table 5 (seeds/004, Appendix C.1): ablations on HotpotQA with Qwen3-4B, two dense retrievers building the
# test set. ## section, then: method | answerable EM, F1 (BERTScore), LJ, ER (evidence ROUGE-L) | unanswerable Acc. |
# overall Acc., B. Acc.
_GRACE_ABLATION_MEASURES = (
    "answerable_em",
    "bertscore_f1",
    "judge_answerable",
    "evidence_rouge",
    "judge_unanswerable",
    "judge_accuracy",
    "judge_balanced_accuracy",
)
_GRACE_ABLATION_TABLE = """
## HotpotQA, dense retriever Qwen3-Embedding-0.6B (296:204)
Naive          | 66.89 86.51 91.22 45.43 59.80 78.40 75.51
SR             | 61.82 80.66 89.53 59.67 62.25 78.40 75.89
W/O AB         | 65.54 84.21 92.23 62.56 67.16 82.00 79.70
W/O Weighting  | 59.80 80.19 89.19 60.79 56.37 75.80 72.78
EM Reward      | 66.55 85.89 92.57 21.82 62.75 80.40 77.66
GRACE          | 65.20 84.95 91.55 70.36 66.18 81.20 78.87
## HotpotQA, dense retriever BAAI bge-m3 (330:170)
W/O AB         | 63.64 84.10 90.00 62.72 62.31 80.60 76.16
GRACE          | 66.97 86.18 93.33 62.82 64.71 83.60 79.02
"""


def _grace_ablation_rows() -> list[ReferenceRow]:
    rows = []
    for group, method, numbers in _sections(_GRACE_ABLATION_TABLE):
        if len(numbers) != len(_GRACE_ABLATION_MEASURES):
            raise ValueError(f"Table 5: {method} has {len(numbers)} values")
        retriever = "Qwen" if "Qwen" in group else "BAAI"
        values = {"hotpotqa": dict(zip(_GRACE_ABLATION_MEASURES, map(_number, numbers)))}
        rows.append(ReferenceRow(f"[Table 5] {method} ({retriever})", group, values))
    return rows


_ANSWER_REWARD_NOTES = (
    "EM of the 1.5B model trained with R^ans averaging the named answers (reward.reward_kwargs.answer_rewards=[...]"
    "; docs/methods/eviomni.md); the paper's Average is its own (a column here, Avg).",
    "A user's row: the reader's EM from the extracted evidence (eval --reader), else the policy's own o_f, marked.",
)
_NOISE_NOTES = (
    "Rows: this evaluation per number of added irrelevant passages k (eval --noise-passages 0,2,4,6,8), EM; the "
    "paper draws its series as a figure and prints no numbers, so there are no reference rows.",
    "The paper's reading: EviOmni (LEAR) loses little EM as k grows and with k = 8 still beats FilCo at k = 0.",
)

# (paper, table) -> layout of an ablation table; the main tables stay in PAPERS.
ABLATION_TABLES: dict[tuple[str, str], dict] = {
    **{
        ("evinote", table): {
            "paper": PAPERS_EVINOTE_TITLE,
            "table": f"Table {table}",
            "family": "search",
            "sources": _EVINOTE_SOURCES,
            "measures": ("f1", "em"),
            "measure_labels": {"f1": "F1", "em": "EM"},
            "scale": 1.0,
            "digits": 3,
            "rows": (lambda table=table: _evinote_ablation_rows(table)),
            "notes": (
                "Train each row with recipes/evinote_grpo.sh and the setting named in docs/methods/evinote.md "
                "(Base: recipes/search_r1_baseline.sh; + FS: ABLATION=force_summary; ...).",
                "The paper tests 500 random questions per data set (Bamboogle: all 125).",
            ),
        }
        for table in _EVINOTE_ABLATIONS
    },
    **{
        (paper, table): {
            "paper": title,
            "table": f"Table {table}",
            "family": "eviomni",
            "sources": ("nq", "triviaqa", "hotpotqa"),
            "measures": ("em",),
            "measure_labels": {"em": "EM"},
            "scale": 100.0,
            "digits": 2,
            "average": True,
            "rows": (lambda paper=paper, table=table: _answer_reward_rows(paper, f"Table {table}")),
            "notes": _ANSWER_REWARD_NOTES,
        }
        for paper, table, title in (("eviomni", "4", PAPERS_EVIOMNI_TITLE), ("lear", "6", PAPERS_LEAR_TITLE))
    },
    **{
        (paper, figure): {
            "paper": title,
            "table": f"Fig. {figure[3:]}",
            "family": "eviomni",
            "sources": ("nq", "triviaqa", "hotpotqa"),
            "measures": ("em",),
            "measure_labels": {"em": "EM"},
            "scale": 100.0,
            "digits": 2,
            "noise_series": True,
            "rows": list,
            "notes": _NOISE_NOTES,
        }
        for paper, figure, title in (("eviomni", "fig5", PAPERS_EVIOMNI_TITLE), ("lear", "fig6", PAPERS_LEAR_TITLE))
    },
    ("grace", "5"): {
        "paper": PAPERS_GRACE_TITLE,
        "table": "Table 5",
        "family": "grace",
        "sources": ("hotpotqa",),
        "measures": _GRACE_ABLATION_MEASURES,
        "measure_labels": {
            "answerable_em": "Ans EM",
            "bertscore_f1": "Ans F1",
            "judge_answerable": "Ans LJ",
            "evidence_rouge": "Ans ER",
            "judge_unanswerable": "Una Acc",
            "judge_accuracy": "Acc",
            "judge_balanced_accuracy": "B.Acc",
        },
        "scale": 100.0,
        "digits": 2,
        "rows": _grace_ablation_rows,
        "notes": (
            "ER: ROUGE-L of the quoted evidence against the gold evidence on the answerable examples (the grace "
            "reward's evidence_rouge); Una Acc: the judge's verdicts on the unanswerable ones (B.Acc is the mean of "
            "Ans LJ and Una Acc in every row of the paper).",
            "Rows: Naive (the naive data construction), SR (one retriever), W/O AB (no class balancing), W/O "
            "Weighting (alpha = beta), EM Reward (exact match instead of ROUGE-L); Qwen3-4B; the test set's "
            "retriever in brackets, answerable:unanswerable in the section heading.",
        ),
    },
}


def available_tables(name: str) -> list[str]:
    """The ``--table`` values of paper ``name``: its main table's number first, then its ablation tables."""
    main = PAPERS[name]["table"].split()[-1]
    return [main, *(table for paper, table in ABLATION_TABLES if paper == name)]


def paper_layout(name: str, table: str | None = None) -> PaperLayout:
    """The layout and reference rows of ``--paper NAME [--table N]`` (default: the paper's main table)."""
    if name not in PAPERS:
        raise ValueError(f"unknown paper {name!r}; choose from {', '.join(PAPERS)}")
    table = None if table is None else str(table).strip().lower().removeprefix("table").strip()
    if table is None or table == PAPERS[name]["table"].split()[-1]:
        spec = dict(PAPERS[name])
    elif (name, table) in ABLATION_TABLES:
        spec = dict(ABLATION_TABLES[(name, table)])
    else:
        raise ValueError(f"--paper {name} has no table {table!r}; choose from {', '.join(available_tables(name))}")
    rows = spec.pop("rows")()
    return PaperLayout(name=name, reference=rows, **spec)
