"""The smoke runs' one table of per-method needs, and the cache lock two recipes starting at once share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock, Timeout

from verl_evidence.local.smoke import settings
from verl_evidence.local.smoke.data import DATA_KINDS
from verl_evidence.local.smoke.settings import SMOKE_METHODS, WARMUP_STEPS, locked, smoke_method


def test_every_method_names_known_data_and_a_known_warm_up_family() -> None:
    assert set(SMOKE_METHODS) == {"eviomni", "lear", "evinote", "search_r1", "grace", "composite", "evipath_sft"}
    for name, method in SMOKE_METHODS.items():
        assert (method.data is None) == (method.family is None), name  # SFT alone trains on the warm-up data
        assert method.data is None or method.data in DATA_KINDS, name
        assert method.family is None or method.family in WARMUP_STEPS, name
    # the search family's observation cut and response budget reach every search reward (composite: EviNote + F1)
    for name in ("evinote", "search_r1", "composite"):
        assert SMOKE_METHODS[name].settings["MAX_OBS_TOKENS"] == str(settings.SMOKE_MAX_OBS_TOKENS)
        assert SMOKE_METHODS[name].settings["RESPONSE_LEN"] == str(settings.SMOKE_SEARCH_RESPONSE_LEN)
    assert [name for name, method in SMOKE_METHODS.items() if method.nli_judge] == ["evinote", "composite"]


def test_an_unknown_method_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown smoke method 'nope'; one of eviomni, lear, evinote"):
        smoke_method("nope")


HOLD_THEN_MARK = """
import sys, time
from pathlib import Path
from verl_evidence.local.smoke.settings import locked
with locked(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    Path(sys.argv[1] + ".done").touch()  # the last thing under the lock
"""


@pytest.mark.mostly_waits  # tests/scheduling.py
def test_the_cache_lock_excludes_another_process_until_it_is_released(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "policy-search"
    command = [sys.executable, "-c", HOLD_THEN_MARK, str(target), "2"]
    holder = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lock_file = target.with_suffix(".lock")
        assert lock_file.exists()
        with pytest.raises(Timeout):
            FileLock(lock_file).acquire(timeout=0.2)
        with locked(target):  # waits, without a timeout, for the holder to finish
            assert Path(f"{target}.done").exists()
    finally:
        holder.kill()
        holder.wait()


# A process preparing METHOD whose warm-up waits (inside its build) for ``release`` in the flag directory. Only the
# warm-up's training and the rows are doubles: what is tested is which locks ``smoke prepare`` holds while it builds.
PREPARE_WITH_A_HELD_WARM_UP = """
import shutil, sys, time
from pathlib import Path
from verl_evidence.local.smoke import cli, training, warmup_data
flags = Path(sys.argv[1])
def warm_up(base, examples, out, steps, seed=0):
    (flags / "building").touch()
    while not (flags / "release").exists():
        time.sleep(0.05)
    shutil.copytree(base, out)
    return [1.0]
training.warm_up = warm_up
warmup_data.warmup_examples = lambda family, base: []
warmup_data.warmed_up_rows = lambda method, policy, warmup=None: policy / "rows.parquet"
print(cli.prepare(sys.argv[2])["MODEL_PATH"], flush=True)
"""


@pytest.mark.mostly_waits  # tests/scheduling.py
def test_a_warm_up_being_built_holds_up_neither_another_warm_up_nor_its_data(tmp_path: Path, monkeypatch) -> None:
    """Two benchmark processes (or recipes) preparing different methods build their warm-ups at the same time: the
    warm-up trains on one thread, so on two cores that halves an empty cache's wait. Same warm-up: built once."""
    import os
    import shutil
    import threading

    from verl_evidence.local.smoke import cli, training, warmup_data
    from verl_evidence.local.tiny_models import CORPUS_TOKENIZER_ENV

    monkeypatch.setenv("VERL_EVIDENCE_SMOKE_DIR", str(tmp_path / "smoke"))
    monkeypatch.delenv(CORPUS_TOKENIZER_ENV, raising=False)
    flags = tmp_path / "flags"
    flags.mkdir()
    command = [sys.executable, "-c", PREPARE_WITH_A_HELD_WARM_UP, str(flags), "eviomni"]
    other = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        for _ in range(1200):  # up to 60 s for the other process to be inside its warm-up
            if (flags / "building").exists() or other.poll() is not None:
                break
            threading.Event().wait(0.05)
        assert (flags / "building").exists(), "the other process never started its warm-up"

        builds: list[str] = []

        def quick_warm_up(base, examples, out, steps, seed=0):
            builds.append(out.name)
            shutil.copytree(base, out)
            return [1.0]

        monkeypatch.setattr(training, "warm_up", quick_warm_up)
        monkeypatch.setattr(warmup_data, "warmup_examples", lambda family, base: [])
        monkeypatch.setattr(warmup_data, "warmed_up_rows", lambda method, policy, warmup=None: policy / "rows.parquet")
        prepared: dict = {}
        grace = threading.Thread(target=lambda: prepared.update(cli.prepare("grace")))
        grace.start()
        grace.join(timeout=60)
        assert not grace.is_alive(), "preparing GRACE waited for EviOmni's warm-up"
        assert other.poll() is None  # EviOmni's warm-up is still being built
        assert Path(prepared["MODEL_PATH"]).name == builds[0] and builds[0].startswith("policy-grace")

        (flags / "release").touch()
        assert other.wait(timeout=60) == 0
        eviomni = Path(other.stdout.read().strip())
        assert (eviomni / "model.safetensors").exists() and eviomni.name.startswith("policy-eviomni")
        # the same warm-up again, in this process: found built, not built twice
        monkeypatch.setattr(training, "warm_up", lambda *a, **k: pytest.fail("a built warm-up was built again"))
        assert cli.prepare("lear")["MODEL_PATH"] == str(eviomni)
    finally:
        (flags / "release").touch()
        other.kill()
        other.wait()


def test_the_corpus_tokenizer_is_lossless_deterministic_shorter_and_cached_apart(monkeypatch) -> None:
    """$VERL_EVIDENCE_TINY_TOKENIZER=N (the learning benchmark's 4000): a BPE trained on the smoke texts, lossless on
    any string, the same special tokens and ids, prompts about half as many tokens, its own smoke cache directory."""
    from verl_evidence.bundled import load_corpus
    from verl_evidence.local.tiny_models import CORPUS_TOKENIZER_ENV, tiny_tokenizer

    monkeypatch.delenv(CORPUS_TOKENIZER_ENV, raising=False)
    recipes_tokenizer, recipes_dir = tiny_tokenizer(), settings.smoke_dir()
    monkeypatch.setenv(CORPUS_TOKENIZER_ENV, "4000")
    corpus_tokenizer = tiny_tokenizer()
    assert 3000 < len(corpus_tokenizer) <= 4000 and len(recipes_tokenizer) < 600
    for name in ("eos_token_id", "pad_token_id"):
        assert getattr(corpus_tokenizer, name) == getattr(recipes_tokenizer, name)
    odd = "Ünïcode ✓ 🚀\ttabs  and\nnewlines <answer> x </answer> <|im_end|>"
    assert corpus_tokenizer.decode(corpus_tokenizer.encode(odd)) == odd
    assert len(corpus_tokenizer.encode("<|im_start|>")) == 1
    passage = load_corpus()[0]["contents"]
    assert len(recipes_tokenizer.encode(passage)) > 1.8 * len(corpus_tokenizer.encode(passage))
    rebuilt = subprocess.run(  # another interpreter (another hash seed) trains the same tokenizer
        [
            sys.executable,
            "-c",
            f"from verl_evidence.local.tiny_models import tiny_tokenizer as t; print(t().encode({passage!r}))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "PYTHONHASHSEED": "7"},
    )
    assert rebuilt.stdout.strip() == str(corpus_tokenizer.encode(passage))
    assert settings.smoke_dir() == recipes_dir.with_name(recipes_dir.name + "-tok4000")
    monkeypatch.setenv(CORPUS_TOKENIZER_ENV, "many")
    with pytest.raises(ValueError, match="VERL_EVIDENCE_TINY_TOKENIZER='many': a vocab size"):
        tiny_tokenizer()


def test_a_warm_up_seed_is_cached_apart_and_must_be_a_whole_number(monkeypatch) -> None:
    from verl_evidence.local.smoke.settings import WARMUP_SEED_ENV, warmed_up_policy_name, warmup_seed

    monkeypatch.delenv(WARMUP_SEED_ENV, raising=False)
    assert (warmup_seed(), warmed_up_policy_name("grace")) == (0, "policy-grace")  # the recipes' own warm-ups
    monkeypatch.setenv(WARMUP_SEED_ENV, "0")
    assert warmed_up_policy_name("grace_judged") == "policy-grace_judged-v1"
    monkeypatch.setenv(WARMUP_SEED_ENV, "3")
    assert (warmup_seed(), warmed_up_policy_name("grace_judged")) == (3, "policy-grace_judged-v1-seed3")
    for bad in ("-1", "two", "1.5"):
        monkeypatch.setenv(WARMUP_SEED_ENV, bad)
        with pytest.raises(ValueError, match="VERL_EVIDENCE_SMOKE_WARMUP_SEED"):
            warmup_seed()


def test_a_warm_up_seed_draws_another_order_and_the_same_seed_the_same_losses(tmp_path: Path) -> None:
    from verl_evidence.local.smoke.models import random_policy
    from verl_evidence.local.smoke.training import warm_up

    base = random_policy(tmp_path / "random_policy")
    examples = [
        {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "x" * (i + 1)}]}
        for i in range(4)
    ]
    first = warm_up(base, examples, tmp_path / "a", steps=4, seed=0)
    again = warm_up(base, examples, tmp_path / "b", steps=4, seed=0)
    other = warm_up(base, examples, tmp_path / "c", steps=4, seed=1)
    assert first == again
    assert other != first
