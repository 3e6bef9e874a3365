"""Per-step metrics (verl_evidence.trainer.step_metrics), the sampler that feeds them (step_sampler) and the
version-gated rollout-dump patch (trainer.patches), against verl's real classes.

The verl internals each piece relies on are pinned here: these tests fail when verl changes under them.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from verl_evidence.trainer import step_metrics as sm
from verl_evidence.trainer.step_metrics import MaskingError, Trajectory


def search_trajectory(
    key: str,
    *,
    score: float,
    em: float,
    searches: int,
    notes: int,
    termination: str,
    mask: list[int],
    spans: list[list[int]],
    search_errors: int = 0,
) -> Trajectory:
    info = {"score": score, "em": em, "format_ok": 1.0, "num_searches": float(searches), "reward_error": 0.0}
    fields = {
        "reward_extra_info": info,
        "num_searches": searches,
        "summary_count": notes,
        "search_errors": search_errors,
        "termination": termination,
        "retrieved_spans": spans,
        "question": "q",
        "searches": ["x"] * searches,
    }
    return Trajectory(extra_fields=fields, response_mask=mask, loss_mask=list(mask), key=key)


def two_trajectories() -> list[Trajectory]:
    return [
        search_trajectory(
            "u_0_0",
            score=1.0,
            em=1.0,
            searches=1,
            notes=1,
            termination="answer",
            mask=[1, 1, 0, 0, 0, 1],
            spans=[[2, 5]],
        ),
        search_trajectory(
            "u_1_0",
            score=0.0,
            em=0.0,
            searches=2,
            notes=0,
            termination="max_turns",
            mask=[1, 0, 0, 1],
            spans=[[1, 3]],
            search_errors=1,
        ),
    ]


def test_reward_components_are_the_mean_over_the_step_and_rollout_stats_are_logged_once():
    metrics = sm.step_metrics(two_trajectories(), "evinote")
    assert metrics["reward/evinote/score/mean"] == 0.5
    assert metrics["reward/evinote/em/mean"] == 0.5
    assert metrics["reward/evinote/format_ok/mean"] == 1.0
    assert metrics["reward/evinote/reward_error/mean"] == 0.0
    assert "reward/evinote/num_searches/mean" not in metrics  # a rollout statistic: under rollout/
    assert metrics["rollout/searches/mean"] == 1.5
    assert metrics["rollout/note_rate"] == 0.5 and metrics["rollout/notes/mean"] == 0.5
    assert metrics["rollout/answer_rate"] == 0.5
    assert metrics["rollout/termination/answer"] == metrics["rollout/termination/max_turns"] == 0.5
    assert metrics["rollout/search_errors/mean"] == 0.5 and metrics["rollout/search_error_rate"] == 0.5


def test_masking_shares_count_retrieved_tokens_and_none_trained():
    metrics = sm.step_metrics(two_trajectories(), "evinote")
    assert metrics["masking/response_tokens"] == 10
    assert metrics["masking/context_token_share"] == 5 / 10
    assert metrics["masking/retrieved_token_share"] == 5 / 10
    assert metrics["masking/retrieved_tokens_trained"] == 0
    assert "masking/masked_answer_token_share" not in metrics  # no loop reported such spans


def test_a_trained_retrieved_token_raises_unless_the_check_is_off():
    trajectories = two_trajectories()
    trajectories[1].response_mask = [1, 0, 1, 1]  # position 2 is retrieved and trained
    expected = r"u_1_0: 1 retrieved token\(s\) with loss mask 1 \(response positions \[2\]\)"
    with pytest.raises(MaskingError, match=expected):
        sm.step_metrics(trajectories, "evinote")
    metrics = sm.step_metrics(trajectories, "evinote", mask_check=False)
    assert metrics["masking/retrieved_tokens_trained"] == 1


def test_loss_mask_is_checked_too_and_spans_are_cut_at_the_response():
    trajectory = Trajectory(
        extra_fields={"masked_answer_spans": [[3, 50]]},
        response_mask=[1, 1, 1, 0, 0],
        loss_mask=[1, 1, 1, 0, 1],
        key="k",
    )
    with pytest.raises(MaskingError, match="1 masked_answer token"):
        sm.step_metrics([trajectory], "eviomni")
    metrics = sm.step_metrics([trajectory], "eviomni", mask_check=False)
    assert metrics["masking/masked_answer_token_share"] == 2 / 5


def test_composite_parts_and_weights_and_non_numbers():
    info = {
        "score": 2.0,
        "eviomni.score": 1.0,
        "eviomni.weight": 0.5,
        "grace.weight": 2.0,
        "note": "text",
        "flag": True,
        "nan": float("nan"),
    }
    metrics = sm.reward_metrics([Trajectory(extra_fields={"reward_extra_info": info}, response_mask=[1])], "composite")
    assert metrics == {
        "reward/composite/score/mean": 2.0,
        "reward/composite/eviomni.score/mean": 1.0,
        "reward/composite/eviomni.weight/mean": 0.5,
        "reward/composite/grace.weight/mean": 2.0,
        "reward/composite/flag/mean": 1.0,
    }


@pytest.mark.parametrize(
    ("manager", "function", "label"),
    [
        ("eviomni", None, "eviomni"),
        ("composite", "pkg://verl_evidence.rewards.grace", "composite"),
        ("dapo", "pkg://verl_evidence.rewards.grace", "grace"),
        ("naive", "/x/my_reward.py", "my_reward"),
        ("dapo", None, "dapo"),
        (None, None, "reward"),
        ("naive", "pkg://a.b:compute", "b"),
    ],
)
def test_reward_label(manager, function, label):
    assert sm.reward_label(manager, function) == label


# -- verl's custom-sampler hook (trainer.v1.sampler.custom_sampler) ------------------------------------------------


def build_sampler(make_config, *overrides: str):
    """Our sampler built by verl's own PPOTrainer._build_replay_buffer from a composed config."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    config = make_config(
        "trainer.v1.sampler.custom_sampler.path=pkg://verl_evidence.trainer.step_sampler",
        "trainer.v1.sampler.custom_sampler.name=EvidenceReplayBuffer",
        *overrides,
    )
    trainer = SimpleNamespace(
        config=config, trainer_mode=config.trainer.v1.trainer_mode, _add_prompts_to_generate=lambda n: None
    )
    trainer._resolve_filter_groups_metric = lambda: PPOTrainer._resolve_filter_groups_metric(trainer)
    return PPOTrainer._build_replay_buffer(trainer)


def test_verl_builds_our_sampler_around_its_own_buffer(make_config):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    sampler = build_sampler(make_config, "++trainer.v1.sampler.sampler_kwargs.reward_manager=evinote")
    assert type(sampler.buffer) is ReplayBuffer and sampler.label == "evinote" and sampler.mask_check is True
    assert sampler.trainer_mode == "sync" and sampler.max_off_policy_strategy == "drop"  # verl's, through the wrap
    sampler = build_sampler(
        make_config,
        "trainer.v1.trainer_mode=colocate_async",
        "++trainer.v1.sampler.sampler_kwargs.mask_check=false",
        "++trainer.v1.sampler.sampler_kwargs.reward_manager=dapo",
        "++trainer.v1.sampler.sampler_kwargs.reward_function=pkg://verl_evidence.rewards.grace",
    )
    assert type(sampler.buffer) is ReplayBufferAsync and sampler.label == "grace" and sampler.mask_check is False


def test_options_verl_keeps_from_custom_samplers_pass_through_sampler_kwargs(make_config):
    sampler = build_sampler(
        make_config,
        "++trainer.v1.sampler.sampler_kwargs.sync_refill_failed_groups=true",
        "++trainer.v1.sampler.sampler_kwargs.gen_batch_size=1",
    )
    assert sampler.buffer.sync_refill_failed_groups is True and sampler.buffer.sampler_kwargs == {}
    with pytest.raises(ValueError, match="mask_check"):
        build_sampler(make_config, "++trainer.v1.sampler.sampler_kwargs.mask_check=maybe")


def test_the_sampler_stops_a_mis_masked_training_batch_before_returning_it(make_config, monkeypatch):
    """What stops a run whose loop trains retrieved tokens: sample() raises instead of handing the batch on."""
    from verl_evidence.trainer import step_sampler

    mis_masked = two_trajectories()
    mis_masked[1].response_mask = [1, 0, 1, 1]  # position 2 is retrieved and trained
    read = []
    monkeypatch.setattr(step_sampler, "read_trajectories", lambda keys, partition: read.append(keys) or mis_masked)
    batch = SimpleNamespace(keys=["u_0_0", "u_1_0"])
    for check in ("true", "false"):
        sampler = build_sampler(
            make_config,
            "++trainer.v1.sampler.sampler_kwargs.reward_manager=evinote",
            f"++trainer.v1.sampler.sampler_kwargs.mask_check={check}",
        )
        # verl's buffer's sampling needs TransferQueue; what it returns is what this test is about
        monkeypatch.setattr(sampler.buffer, "sample", lambda **kwargs: (batch, {"verl/own": 1.0}))
        if check == "true":
            with pytest.raises(MaskingError, match="(?s)u_1_0: 1 retrieved token.*nothing was trained on them"):
                sampler.sample(global_steps=1, partition_id="train", batch_size=2)
        else:
            returned, metrics = sampler.sample(global_steps=1, partition_id="train", batch_size=2)
            assert returned is batch and metrics["verl/own"] == 1.0
            assert metrics["masking/retrieved_tokens_trained"] == 1
    assert read == [batch.keys, batch.keys]
    _, metrics = sampler.sample(global_steps=1, partition_id="val", batch_size=2)  # validation is never checked
    assert metrics == {"verl/own": 1.0} and len(read) == 2


def test_the_trainer_logs_what_sample_returns_before_it_trains_on_the_batch():
    """Pins the hook: _step_once merges sample()'s metrics into the step's, and samples before any update."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    source = inspect.getsource(PPOTrainer._step_once)
    assert "batch, off_policy_metrics = self.replay_buffer.sample(" in source
    assert source.index("metrics.update(off_policy_metrics)") < source.index("self._update_actor(")
    build = inspect.getsource(PPOTrainer._build_replay_buffer)
    assert "custom_sampler" in build and "sampler_kwargs=sampler_config.sampler_kwargs" in build
    for cls in (ReplayBuffer, ReplayBufferAsync):
        assert tuple(inspect.signature(cls.sample).parameters) == ("self", "global_steps", "partition_id", "batch_size")


# -- the version-gated rollout-dump columns -------------------------------------------------------------------------


def test_rollout_dump_patch_pins_verls_training_dump():
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from verl_evidence.trainer import patches

    assert patches.verl_supported()
    source = inspect.getsource(PPOTrainer._log_rollout_data)
    assert 'reward_extra_infos_dict = {"uid": [batch.keys[i] for i in sorted_indices]}' in source
    assert tuple(
        inspect.signature(
            PPOTrainer._dump_generations.__wrapped__
            if hasattr(PPOTrainer._dump_generations, "__wrapped__")
            else PPOTrainer._dump_generations
        ).parameters
    ) == (patches.DUMP_PARAMETERS)
    write = inspect.getsource(PPOTrainer._write_generations)
    assert "for k, v in reward_extra_infos_dict.items():" in write and "base_data[k] = v" in write


def test_rollout_dump_patch_adds_columns_only_to_the_training_dump(monkeypatch, tmp_path):
    import transfer_queue as tq
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from verl_evidence.trainer import patches

    class Trainer(PPOTrainer):  # a subclass: verl's own class stays as the plugin left it
        pass

    calls = []
    Trainer._dump_generations = lambda self, *args: calls.append(args)
    Trainer._dump_generations.__signature__ = inspect.signature(PPOTrainer._dump_generations)
    fields = {
        "a_0_0": {
            "reward_extra_info": {"score": 1.0, "em": 1.0},
            "num_searches": 1,
            "termination": "answer",
            "searches": ["q"],
        },
        "a_1_0": {
            "reward_extra_info": {"score": 0.0, "em": 0.0},
            "num_searches": np.int64(2),
            "termination": "max_turns",
            "searches": ["q", "r"],
        },
    }
    requested = []

    def kv_batch_get(keys, partition_id, select_fields):
        requested.append((keys, partition_id, select_fields))
        return {"extra_fields": [fields[k] for k in keys]}

    monkeypatch.setattr(tq, "kv_batch_get", kv_batch_get)
    assert patches.patch_rollout_dump(Trainer)
    Trainer._dump_generations(None, ["i"] * 2, ["o"] * 2, [None] * 2, [1.0, 0.0], {"uid": ["a_1_0", "a_0_0"]}, "d")
    assert requested == [(["a_1_0", "a_0_0"], "train", ["extra_fields"])]
    columns = calls[0][4]
    assert columns["uid"] == ["a_1_0", "a_0_0"]
    assert columns["reward_extra_info"] == [{"score": 0.0, "em": 0.0}, {"score": 1.0, "em": 1.0}]
    assert columns["rollout"][0] == {"num_searches": 2, "termination": "max_turns"}  # scalars only
    validation = {"uid": ["a_0_0"], "reward": [1.0], "em": [1.0]}
    Trainer._dump_generations(None, ["i"], ["o"], [None], [1.0], validation, "d")
    assert calls[1][4] is validation and len(requested) == 1  # validation dumps: as verl writes them
