"""What each recipe's smoke run needs (one table, :data:`SMOKE_METHODS`), the sizes, and the cache directory."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

# Bump when the policy, the warm-up data or the method data change shape: caches keyed by it are rebuilt.
FORMAT_VERSION = 7  # 7: GRACE rows carry their evidence sentences (one joined reference, as the released code scores)
POLICY_HIDDEN = 128
POLICY_LAYERS = 2
WARMUP_ROWS_PER_FORMAT = 8
# Single-example AdamW steps per warm-up family (~0.09 CPU-s each for a ~950-token example). The search format
# (query, observation, note, answer) takes longer to pick up than the other two.
# search_neutral: its notes are well formed in 26 of 64 samples after 1600 steps, 8 of 64 after 800 (warmup_data).
# grace_neutral: both paths in 7 of its 8 questions' groups of 8 after 1600 steps, 1 after 500, no better after 3200.
# search_both_ways (the corpus tokenizer's neutral search world): both replies in all 8 questions' groups after 800.
# search_both_answers: notes 0.17 / 0.16 / 0.29 and EviNote paid 0.11 / 0.10 / 0.27 of 128 samples after 800 / 1600 /
# 2400 steps; every question's 16 samples both right and wrong at each. search_mostly_noted, 2400 steps: notes 0.66,
# EviNote paid 0.66.
WARMUP_STEPS = {
    "eviomni": 500,
    "search": 800,
    "grace": 500,
    "search_neutral": 1600,
    "grace_neutral": 1600,
    "grace_judged": 1600,
    "search_both_ways": 800,
    "search_both_answers": 2400,
    "search_mostly_noted": 2400,
}
# The recipes' own families: each SMOKE_METHODS entry warms up on one, and evipath_sft trains on all three.
FAMILIES = ("eviomni", "search", "grace")
# Warm-ups a smoke run may choose instead of its method's family (``VERL_EVIDENCE_SMOKE_WARMUP``, or
# ``smoke prepare METHOD --warmup NAME``), each with the family whose prompt format it shares. ``search_neutral``:
# notes on half the warm-up questions, none on the other half, so the policy writes a note about half the time and a
# reward can move the note rate either way (the ``search`` warm-up notes in nearly every sample). Used by
# benchmarks/learning.py to compare EviNote's reward with Search-R1's from one policy.
# ``grace_neutral``: each of GRACE's warm-up questions answered in both paths' tags, the same text inside, so a group
# of samples takes either path and GRACE's path term has a spread to move (the ``grace`` warm-up's path is right in
# every sample: nothing for the reward to teach there). ``search_both_ways``: each search question once with a note
# and once without, for policies on the corpus-trained tokenizer (``$VERL_EVIDENCE_TINY_TOKENIZER``), which learn
# ``search_neutral``'s "these questions always noted" by heart: no spread within a group, nothing for a reward to move.
# ``search_both_answers``: search_both_ways, and each example again with another question's answer, so exact match
# too has a spread within a group (search_both_ways' answers are learnt by heart: right in every sample or in none).
# ``search_mostly_noted``: search_both_answers with its noted examples twice, so EviNote's reward pays in about two
# thirds of step 1's samples (search_both_answers: about a quarter, and under a fifth in 7 of 24 runs).
WARMUP_VARIANTS = {
    "search_neutral": "search",
    "grace_neutral": "grace",
    "grace_judged": "grace",
    "search_both_ways": "search",
    "search_both_answers": "search",
    "search_mostly_noted": "search",
}
# A variant's own data version, in its policy's cache name: a changed variant is warmed up again while the recipes'
# families (what the test suite's smoke runs use) keep their caches. Bump a variant's entry when its examples change.
VARIANT_VERSIONS = {
    "search_neutral": 2,
    "grace_neutral": 1,
    "grace_judged": 1,
    "search_both_ways": 1,
    "search_both_answers": 1,
    "search_mostly_noted": 1,
}
WARMUP_ENV = "VERL_EVIDENCE_SMOKE_WARMUP"
# Another warm-up of the same data (its examples' order and torch's seed): for checking that a learning result holds
# over several warm-ups, not one machine's (benchmarks/learning.py --warmup-seed). 0, the default, is every recipe's.
WARMUP_SEED_ENV = "VERL_EVIDENCE_SMOKE_WARMUP_SEED"
WARMUP_LR = 3e-3
SMOKE_TOPK = 2  # passages per EviOmni prompt: ~900 tokens with the byte-level tokenizer
# Search recipes: one passage per search cut at this many tokens, and a response budget that holds a query, that
# observation, the final-turn notice, a note and an answer (~330 tokens with the byte-level tokenizer).
SMOKE_MAX_OBS_TOKENS = 96
SMOKE_SEARCH_RESPONSE_LEN = 384
_SEARCH_SETTINGS = {"MAX_OBS_TOKENS": str(SMOKE_MAX_OBS_TOKENS), "RESPONSE_LEN": str(SMOKE_SEARCH_RESPONSE_LEN)}
# EviOmni's and GRACE's prompts carry their papers' full instructions (~1000 characters, one token each with the
# byte-level tokenizer): with two passages a prompt is ~1250-1400 tokens, over the common smoke default of 1024.
_LONG_PROMPT_SETTINGS = {"PROMPT_LEN": "1536"}


@dataclass(frozen=True)
class SmokeMethod:
    """One recipe's smoke run."""

    # The bundled data preparation whose rows it trains on (:func:`.data.method_data`); None: the warm-up data
    data: str | None
    # The warm-up family (recipes that share a prompt format share a warmed-up policy); None: the random policy
    family: str | None
    # Recipe variables beyond the common smoke defaults (recipes/_common.sh); a value in the environment still wins
    settings: dict[str, str] = field(default_factory=dict)
    # EviNote: the offline NLI judge whose entailment follows token overlap
    nli_judge: bool = False


SMOKE_METHODS: dict[str, SmokeMethod] = {
    "eviomni": SmokeMethod(data="eviomni", family="eviomni", settings=_LONG_PROMPT_SETTINGS),
    "lear": SmokeMethod(data="lear", family="eviomni", settings=_LONG_PROMPT_SETTINGS),
    "evinote": SmokeMethod(data="evinote", family="search", settings=_SEARCH_SETTINGS, nli_judge=True),
    # Search-R1 scores exact match alone. verl's seeded shuffle gives each step the same questions, and the tiny
    # policy answers only one or two of the eight at all (seen in a rollout dump). At temperature 1.0, step 2's
    # answerable question was right in 7-8 of its 8 samples, so about 1 run in 3 had no group with a spread at
    # step 2. At 1.3 it is right in about 5 of 8, and a group with a spread is expected in ~98 % of runs.
    # Four groups per step, not two.
    "search_r1": SmokeMethod(
        data="search_r1", family="search", settings={**_SEARCH_SETTINGS, "BATCH": "4", "TEMPERATURE": "1.3"}
    ),
    "grace": SmokeMethod(data="grace", family="grace", settings=_LONG_PROMPT_SETTINGS),
    # EviNote + 0.5 x answer F1 (recipes/presets/reward_preset/composite.yaml): EviNote's rows, loop and judge
    "composite": SmokeMethod(data="evinote", family="search", settings=_SEARCH_SETTINGS, nli_judge=True),
    # verl's SFT trainer from the random policy on every family's warm-up examples
    "evipath_sft": SmokeMethod(data=None, family=None),
}
METHODS = tuple(SMOKE_METHODS)


def smoke_method(method: str) -> SmokeMethod:
    if method not in SMOKE_METHODS:
        raise ValueError(f"unknown smoke method {method!r}; one of {', '.join(METHODS)}")
    return SMOKE_METHODS[method]


def warmup_family(method: str, warmup: str | None = None) -> str | None:
    """The warm-up family a smoke run of ``method`` uses: its own, or ``warmup`` (its own or a variant of it)."""
    family = smoke_method(method).family
    if not warmup or warmup == family:
        return family
    if warmup not in WARMUP_VARIANTS:
        raise ValueError(f"unknown warm-up {warmup!r}; one of {', '.join(sorted(WARMUP_STEPS))}")
    if WARMUP_VARIANTS[warmup] != family:
        raise ValueError(
            f"warm-up {warmup!r} writes the {WARMUP_VARIANTS[warmup]!r} family's format; "
            f"{method} trains the {family!r} family's format"
        )
    return warmup


def warmup_seed() -> int:
    """``$VERL_EVIDENCE_SMOKE_WARMUP_SEED``: the warm-up's seed, 0 when unset."""
    value = os.environ.get(WARMUP_SEED_ENV, "").strip() or "0"
    if not value.isdigit():
        raise ValueError(f"{WARMUP_SEED_ENV}={value!r}: a warm-up seed is a whole number, 0 or more")
    return int(value)


def warmup_seed_suffix() -> str:
    """What a warm-up seed other than 0 adds to its policy's and its loss log's names: ``-seed<N>``."""
    seed = warmup_seed()
    return f"-seed{seed}" if seed else ""


def warmed_up_policy_name(family: str) -> str:
    """The directory a warm-up's policy is cached in: ``policy-<cache name>``, and ``-seed<N>`` for a seed other than
    0 (each seed's warm-up is its own policy)."""
    return f"policy-{warmup_cache_name(family)}{warmup_seed_suffix()}"


def warmup_cache_name(family: str) -> str:
    """The name a warm-up's policy is cached under: the family, or a variant with its data version."""
    version = VARIANT_VERSIONS.get(family)
    return family if version is None else f"{family}-v{version}"


@functools.cache  # read once per process: smoke_dir() asks for it at every cache lookup
def prompts_digest() -> str:
    """A digest of the prompts the smoke rows and warm-up examples are rendered from (each method's data prompt and
    EviOmni's masked-answer prompt): a changed prompt gets a fresh cache (new rows, warm-ups trained again) instead of
    a policy warmed up on the old text."""
    import hashlib

    from verl_evidence.dataprep.templates import DEFAULT_PROMPTS
    from verl_evidence.prompts import load_prompt

    digest = hashlib.sha256()
    for name in sorted({*DEFAULT_PROMPTS.values(), "eviomni_answer"}):
        digest.update(f"{name}\0{load_prompt(name)}\0".encode())
    return digest.hexdigest()[:10]


def smoke_dir() -> Path:
    """``$VERL_EVIDENCE_SMOKE_DIR``, else ``smoke/`` in the project's one cache (``$VERL_EVIDENCE_CACHE``, default
    ``~/.cache/verl-evidence``): a fresh ``VERL_EVIDENCE_CACHE`` is a first run's empty cache, smoke policies
    included. Keyed by the format version and the prompts' digest."""
    from retrieval_server.config import cache_dir
    from verl_evidence.local.tiny_models import corpus_vocab_size

    root = os.environ.get("VERL_EVIDENCE_SMOKE_DIR") or cache_dir() / "smoke"
    vocab = corpus_vocab_size()  # the opt-in corpus-trained tokenizer: its own policies, rows and warm-ups
    return Path(root) / (f"v{FORMAT_VERSION}-{prompts_digest()}" + ("" if vocab is None else f"-tok{vocab}"))


def locked(path: Path) -> FileLock:
    """A cross-process lock on ``path`` (file ``<path>.lock``), waited for without a timeout: two recipes
    starting at once build the cache once. Use as ``with locked(path): ...``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path.with_suffix(".lock"))
