"""Recipes really train: ``recipes/<name>.sh --smoke`` runs verl's own trainer (main_ppo) for 2 steps on CPU.

Each run uses the recipe's presets and reward manager unchanged, a tiny policy warmed
up on the methods' formats (verl_evidence.local.smoke), and data prepared from the bundled
set. The assertions read verl's own metrics from verl's file logger
(``trainer.logger=[console,file]``) at step 2: rewards that differ within a GRPO group
(non-zero advantages), a gradient, and a rollout that generates from the synced weights
(verl's rollout-vs-actor log-prob gap stays small after an update large enough to move it).
The same runs check the per-step metrics of verl_evidence.trainer.step_sampler: at steps 1 and 2
every reward component is there and equals the mean of the per-sample values verl's
rollout dump (``trainer.rollout_data_dir``) holds for that step, the rollout behaviour
matches the dump too, and no retrieved or masked-answer token was trained.

The EviOmni run is the session's shared ``eviomni_smoke_run`` (tests/conftest.py; tests/eval evaluates its
checkpoints). EviNote's run is the Slurm job's (tests/recipes/test_slurm_job.py): the job trains ``evinote_grpo.sh
--smoke`` on two Ray nodes, searching the server it started, and is cancelled after step 1 and requeued for step 2;
:func:`check_evinote_run` reads that run (a trainer start is ~50 CPU-s, and the suite's time is bounded). GRACE's
trains here, in its own temporary directory (tests/smoke_runs.py).

A loop that trains its retrieved tokens is stopped before the update without a trainer run of its own (one costs
~50 CPU-s of start-up): the real AgentLoopWorker's trajectories of such a loop fail the check
(tests/rollout/test_masking_check.py), the sampler raises it from ``sample()`` before returning the batch, and verl
samples before it updates (tests/adapters/test_step_metrics.py); :func:`check_evinote_run` reads the check's metrics
from the real trainer.
"""

from __future__ import annotations

import pytest
from smoke_runs import SmokeRun, run_smoke

from verl_evidence.trainer.step_metrics import ROLLOUT_STATS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = (1, 2)


def assert_step_metrics_match_the_dump(run: SmokeRun, reward: str, components: set[str]) -> None:
    """At steps 1 and 2: every reward component is logged as the mean over that step's dumped samples."""
    for step in STEPS:
        metrics, rows = run.step(step), run.dumped(step)
        assert len(rows) > 1
        keys = set(rows[0]["reward_extra_info"])
        assert components <= keys, (components - keys, keys)
        for key in keys - set(ROLLOUT_STATS):
            mean = sum(float(row["reward_extra_info"][key]) for row in rows) / len(rows)
            assert metrics[f"reward/{reward}/{key}/mean"] == pytest.approx(mean, abs=1e-6), (step, key)
        # the manager's total is the trainer's score wherever no penalty is added to it (DAPO adds one)
        if reward != "grace":
            assert metrics[f"reward/{reward}/score/mean"] == pytest.approx(metrics["critic/score/mean"], abs=1e-5)
        assert metrics["masking/response_tokens"] > 0


def rollout_mean(rows: list[dict], key: str, transform=float) -> float:
    return sum(transform(row["rollout"][key]) for row in rows) / len(rows)


def assert_learning_signal(metrics: dict[str, float]) -> None:
    # GRPO advantages are non-zero only where rewards differ within a group.
    assert metrics["critic/advantages/max"] > 0 and metrics["critic/advantages/min"] < 0, metrics
    assert metrics["critic/score/max"] > metrics["critic/score/min"], metrics
    assert metrics["actor/grad_norm"] > 0, metrics
    # Step 2's samples came from the weights step 1 produced: the rollout's log-probs match the actor's.
    assert metrics["training/rollout_probs_diff_valid"] == 1.0, metrics
    assert metrics["training/rollout_probs_diff_mean"] < 1e-4, metrics


@pytest.mark.run_last  # reads the shared run (eviomni_smoke_run) that longer tests start
def test_eviomni_recipe_trains_on_cpu(eviomni_smoke_run):
    run = eviomni_smoke_run  # the session's one EviOmni run (tests/conftest.py), also read by tests/eval
    assert "actor_rollout_ref.rollout.name=hf" in run.output  # the printed command is the one that ran
    assert_learning_signal(run.step(2))
    assert_step_metrics_match_the_dump(run, "eviomni", {"score", "ans_f", "ans_r", "ans_e", "len", "format"})
    for step in STEPS:
        metrics, rows = run.step(step), run.dumped(step)
        # o_r / o_e are never in the trained response
        assert metrics["masking/masked_answer_token_share"] == metrics["masking/masked_answer_tokens_trained"] == 0
        assert metrics["rollout/answer_rate"] == pytest.approx(
            rollout_mean(rows, "termination", lambda t: t == "answer")
        )


def check_evinote_run(run: SmokeRun) -> None:
    """What EviNote's smoke run must show at steps 1 and 2 (the Slurm job's run: tests/recipes/test_slurm_job.py)."""
    metrics = run.step(2)
    assert metrics["num_turns/max"] >= 4  # user, the search turn, its observation, the answer turn
    # Rewards differ within a group: some samples close an annotated <summary> and an <answer> (gate + EQR from the
    # NLI judge actor), others do not (0).
    assert_learning_signal(metrics)
    assert_step_metrics_match_the_dump(run, "evinote", {"score", "em", "eqr", "notes_ok", "format_ok", "has_summary"})
    for step in STEPS:
        metrics, rows = run.step(step), run.dumped(step)
        assert metrics["rollout/searches/mean"] == pytest.approx(rollout_mean(rows, "num_searches"))
        assert metrics["rollout/note_rate"] == pytest.approx(rollout_mean(rows, "summary_count", lambda n: n > 0))
        assert metrics["rollout/search_errors/mean"] == pytest.approx(rollout_mean(rows, "search_errors"))
        assert metrics["rollout/answer_rate"] == pytest.approx(
            rollout_mean(rows, "termination", lambda t: t == "answer")
        )
        # the searches' observations are in the response, and none of their tokens is trained
        assert metrics["masking/retrieved_token_share"] > 0
        assert metrics["masking/retrieved_tokens_trained"] == 0


@pytest.mark.longest_first(3)
def test_grace_dapo_recipe_trains_on_cpu_through_verls_dapo_manager(tmp_path):
    run = run_smoke("grace_dapo.sh", tmp_path).check_finished()
    # verl pprints its resolved config: the reward manager is verl's own dapo, GRACE's score its custom function
    assert "'name': 'dapo'," in run.output, "not verl's DAPO reward manager"
    assert "'path': 'pkg://verl_evidence.rewards.grace'" in run.output
    assert_learning_signal(run.step(2))
    # logged under GRACE's name (the scoring function of verl's dapo manager)
    assert_step_metrics_match_the_dump(
        run, "grace", {"score", "format", "path", "content", "evidence_rouge", "answer_rouge"}
    )
