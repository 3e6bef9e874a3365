"""The CPU training mode's pieces, and the verl internals it depends on (these fail loudly when verl changes)."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from verl_evidence.local import cpu_rollout, verl_patches


def test_unsupported_verl_version_is_refused_with_a_clear_message():
    with pytest.raises(RuntimeError, match=r"supports verl 0\.9\.x; verl 0\.10\.0 is installed"):
        verl_patches.check_verl_version("0.10.0")
    assert verl_patches.check_verl_version().startswith("0.9.")


# --- the private verl internals the mode patches: if one of these fails, verl changed under cpu_mode ---


def test_verl_still_looks_up_rollout_adapters_in_its_private_registry():
    from verl.workers.rollout import base

    assert isinstance(base._ROLLOUT_REGISTRY, dict) and ("vllm", "async") in base._ROLLOUT_REGISTRY
    assert "_ROLLOUT_REGISTRY[(rollout_name, mode)]" in inspect.getsource(base.get_rollout_class)


def test_verl_still_builds_a_process_group_backend_torch_rejects_on_cpu():
    import verl.utils.distributed as distributed

    for function in (distributed.initialize_global_process_group, distributed.initialize_global_process_group_ray):
        source = inspect.getsource(getattr(function, "__wrapped__", function))
        assert 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' in source, function.__name__


def test_verl_fsdp_engine_still_pins_the_reference_policy_offload():
    from verl.workers.engine.fsdp import transformer_impl

    policy = transformer_impl.CPUOffloadPolicy
    assert "CPUOffloadPolicy(pin_memory=True)" in inspect.getsource(transformer_impl.FSDPEngine._build_fsdp_module)
    assert getattr(policy, "_verl_evidence_cpu", False) or policy.__module__.startswith("torch.")


def test_verl_fsdp_engine_still_takes_token_log_probs_from_the_per_row_loop():
    """The log-prob patch replaces the engine's ``logprobs_from_logits`` name; verl must still import it there and
    still fall back, without flash-attn, to the one-``logsumexp``-per-row loop the patch batches."""
    from verl.utils import torch_functional
    from verl.workers.engine.fsdp import transformer_impl

    used = getattr(transformer_impl.logprobs_from_logits, "__wrapped__", transformer_impl.logprobs_from_logits)
    assert used is torch_functional.logprobs_from_logits
    assert "logprobs_from_logits(" in inspect.getsource(transformer_impl.FSDPEngineWithLMHead.prepare_model_outputs)
    assert "for logit in logits" in inspect.getsource(torch_functional.logprobs_from_logits_v2)


def test_cpu_log_probs_equal_verls_in_value_and_gradient(monkeypatch):
    import types

    import torch
    from verl.utils import torch_functional

    engine = types.SimpleNamespace(logprobs_from_logits=torch_functional.logprobs_from_logits)
    verl_patches.patch_log_probs(engine)
    verl_patches.patch_log_probs(engine)  # idempotent
    assert engine.logprobs_from_logits.__wrapped__ is torch_functional.logprobs_from_logits
    monkeypatch.setattr(verl_patches, "LOG_PROB_CHUNK_ELEMENTS", 3 * 50)  # chunks of 3 rows: 37 rows, uneven split
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 50, (37,), generator=generator)
    for shape in ((37, 50), (1, 37, 50)):  # padding removed (a row a token), and a batch of sequences
        logits = torch.randn(37, 50, generator=generator).reshape(shape)
        ours_in, verls_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        ours = engine.logprobs_from_logits(ours_in, labels.reshape(shape[:-1]))
        verls = torch_functional.logprobs_from_logits(verls_in, labels.reshape(shape[:-1]))
        assert ours.shape == verls.shape
        assert torch.allclose(ours, verls, atol=1e-6)
        weights = torch.randn(ours.shape, generator=generator)
        (ours * weights).sum().backward()
        (verls * weights).sum().backward()
        assert torch.allclose(ours_in.grad, verls_in.grad, atol=1e-6)
    half = torch.randn(5, 50, generator=generator).bfloat16()
    assert torch.equal(  # bfloat16 stays on verl's own path
        engine.logprobs_from_logits(half, labels[:5]), torch_functional.logprobs_from_logits(half, labels[:5])
    )


def test_verl_replay_buffer_still_sleeps_its_default_poll_interval_between_checks():
    from verl.trainer.ppo.v1 import replay_buffer, trainer_base

    init = getattr(replay_buffer.ReplayBuffer.__init__, "__wrapped__", replay_buffer.ReplayBuffer.__init__)
    assert inspect.signature(init).parameters["poll_interval"].default == verl_patches.VERL_REPLAY_BUFFER_POLL_DEFAULT
    assert "time.sleep(self.poll_interval)" in inspect.getsource(replay_buffer.ReplayBuffer._wait_for_next_poll)
    # the trainer leaves the interval at its default: the patch is what shortens it
    assert "poll_interval" not in inspect.getsource(trainer_base.PPOTrainer._build_replay_buffer)
    assert issubclass(replay_buffer.ReplayBufferAsync, replay_buffer.ReplayBuffer)
    assert "__init__" not in vars(replay_buffer.ReplayBufferAsync)


def test_replay_buffer_poll_setting_is_read_and_checked(monkeypatch):
    monkeypatch.delenv("VERL_EVIDENCE_CPU_POLL_S", raising=False)
    assert verl_patches.replay_buffer_poll_s() == verl_patches.REPLAY_BUFFER_POLL_S
    monkeypatch.setenv("VERL_EVIDENCE_CPU_POLL_S", "0.5")
    assert verl_patches.replay_buffer_poll_s() == 0.5
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv("VERL_EVIDENCE_CPU_POLL_S", bad)
        with pytest.raises(ValueError, match="VERL_EVIDENCE_CPU_POLL_S"):
            verl_patches.replay_buffer_poll_s()


def test_verl_trainer_still_names_prompts_by_uuid4_and_hands_batches_over_as_they_finish():
    from verl.trainer import main_ppo
    from verl.trainer.ppo.v1 import agent_loop_tq, replay_buffer, trainer_base

    source = inspect.getsource(trainer_base)
    assert "\nimport uuid\n" in source and source.count("uuid.") == source.count("str(uuid.uuid4())") == 2
    materialize = inspect.getsource(getattr(replay_buffer.ReplayBuffer._materialize_batch, "__wrapped__", None) or
                                    replay_buffer.ReplayBuffer._materialize_batch)  # fmt: skip
    assert "for key, tag in partition_snapshot.items():" in materialize and 'uid = key.split("_")[0]' in materialize
    assert "_materialize_batch" not in vars(replay_buffer.ReplayBufferAsync)
    assert 'keys.append(f"{uid}_{session_id}_{i}")' in inspect.getsource(agent_loop_tq)
    run_ppo = inspect.getsource(main_ppo.run_ppo)  # how the switch reaches every Ray worker
    assert 'os.environ["VERL_FULL_DETERMINISM"] = "1"' in run_ppo
    assert 'os.environ["PYTHONHASHSEED"] = str(rollout_cfg.seed)' in run_ppo


def test_seeded_uuids_repeat_with_the_seed_only_under_full_determinism(monkeypatch, caplog):
    monkeypatch.setenv("VERL_FULL_DETERMINISM", "1")
    monkeypatch.setenv("PYTHONHASHSEED", "5")
    names = [verl_patches.SeededUUIDs().uuid4() for _ in range(2)]
    first = verl_patches.SeededUUIDs()
    run = [first.uuid4() for _ in range(3)]
    assert run[0] == names[0] == names[1] and len(set(run)) == 3 and run[0].version == 4
    monkeypatch.setenv("PYTHONHASHSEED", "6")
    assert verl_patches.SeededUUIDs().uuid4() != run[0]
    monkeypatch.delenv("PYTHONHASHSEED")  # a worker without main_ppo's environment: seed 0, said aloud
    with caplog.at_level("WARNING", logger=verl_patches.__name__):
        assert verl_patches.determinism_seed() == 0
    assert "PYTHONHASHSEED" in caplog.text and "seed 0" in caplog.text
    monkeypatch.delenv("VERL_FULL_DETERMINISM")
    assert verl_patches.SeededUUIDs().uuid4() != verl_patches.SeededUUIDs().uuid4()  # verl's own: random
    assert verl_patches.SeededUUIDs().UUID is __import__("uuid").UUID  # the rest of the module passes through


def test_a_steps_batch_is_ordered_by_prompt_and_sample_only_under_full_determinism(monkeypatch):
    from verl.trainer.ppo.v1 import replay_buffer

    monkeypatch.setattr(replay_buffer.ReplayBuffer, "_materialize_batch", replay_buffer.ReplayBuffer._materialize_batch)
    monkeypatch.setattr(replay_buffer, "tq", SimpleNamespace(kv_clear=lambda **kwargs: None))
    verl_patches.patch_batch_order()
    finished = ["b_10_0", "a_2_0", "c_0_0", "b_2_0", "a_10_0", "b_0_0"]  # in the order trajectories finished
    snapshot = {key: {"finished": n} for n, key in enumerate(finished)}

    def batch() -> list[str]:
        meta = replay_buffer.ReplayBuffer._materialize_batch(None, "train", ["a", "b"], snapshot)
        assert [tag["finished"] for tag in meta.tags] == [finished.index(key) for key in meta.keys]  # tags follow
        return meta.keys

    monkeypatch.delenv("VERL_FULL_DETERMINISM", raising=False)
    assert batch() == ["b_10_0", "a_2_0", "b_2_0", "a_10_0", "b_0_0"]  # verl's own order
    monkeypatch.setenv("VERL_FULL_DETERMINISM", "1")
    assert batch() == ["a_2_0", "a_10_0", "b_0_0", "b_2_0", "b_10_0"]


# --- registration, in fresh processes (plugins load on `import verl`) ---

PROBE = r"""
import json, verl
from verl.plugin.platform import get_platform
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.workers.rollout.base import _ROLLOUT_REGISTRY
out = {"hf_replica": "hf" in RolloutReplicaRegistry._registry, "hf_adapter": ("hf", "async") in _ROLLOUT_REGISTRY}
if out["hf_replica"]:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    import verl.utils.distributed as distributed
    platform = get_platform()
    out.update(
        device=platform.device_name, backend=platform.communication_backend_name(),
        device_module_current=platform.device_module.current_device(),
        engine=EngineRegistry.get_engine_cls("language_model", "fsdp2") is FSDPEngineWithLMHead,
        replica=RolloutReplicaRegistry.get("hf").__name__,
    )
    from verl.workers.engine.fsdp import transformer_impl
    out["chunked_log_probs"] = getattr(transformer_impl.logprobs_from_logits, "_verl_evidence_cpu", False)
    import os, torch.distributed
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PROBE_PORT"])
    distributed.initialize_global_process_group_ray()
    out["process_group_backend"] = torch.distributed.get_backend()
print("PROBE" + json.dumps(out))
"""


def _probe(env_update: dict[str, str], script: str = PROBE, marker: str | None = None) -> dict:
    """What ``script`` printed on its lines starting PROBE/POLL (or only ``marker``), merged into one dict."""
    from retrieval_server.haproxy_front import free_port

    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env.update(env_update, PROBE_PORT=str(free_port()))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found: dict = {}
    for line in result.stdout.splitlines():
        for prefix in (marker,) if marker else ("PROBE", "POLL"):
            if line.startswith(prefix):
                found.update(json.loads(line[len(prefix) :]))
    assert found, result.stdout[-3000:]
    return found


# One fresh interpreter per setting of the environment (the plugin reads it on `import verl`), reading both what
# PROBE and what POLL_PROBE report: a verl import costs several CPU-seconds.
@pytest.fixture(scope="module")
def selected() -> dict:
    return _probe({"VERL_PLATFORM": "cpu"}, PROBE + POLL_PROBE)


@pytest.fixture(scope="module")
def unselected() -> dict:
    return _probe({}, PROBE + POLL_PROBE)


@pytest.mark.slow
@pytest.mark.one_worker_group("cpu_mode_probes")
def test_selected_mode_registers_platform_engine_rollout_and_a_working_process_group(selected):
    probe = {key: value for key, value in selected.items() if key not in POLL_KEYS}
    assert probe == {
        "hf_replica": True,
        "hf_adapter": True,
        "device": "cpu",
        "backend": "gloo",
        "device_module_current": "cpu",
        "engine": True,
        "replica": "HFRolloutReplica",
        "process_group_backend": "gloo",
        "chunked_log_probs": True,
    }


POLL_PROBE = r"""
import json, verl
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
args = dict(
    trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop",
    sampler_kwargs={},
)
print("POLL" + json.dumps({
    "default": ReplayBuffer(**args).poll_interval,
    "async": ReplayBufferAsync(**dict(args, trainer_mode="async")).poll_interval,
    "caller_keyword": ReplayBuffer(**args, poll_interval=3.0).poll_interval,
    "caller_positional": ReplayBuffer(*args.values(), 4.0).poll_interval,
}))
from verl.trainer.ppo.v1 import trainer_base
print("POLL" + json.dumps({
    "seeded_uids": type(trainer_base.uuid).__name__ == "SeededUUIDs",
    "ordered_batches": getattr(ReplayBuffer._materialize_batch, "_verl_evidence_cpu", False),
}))
"""
POLL_KEYS = ("default", "async", "caller_keyword", "caller_positional", "seeded_uids", "ordered_batches")


@pytest.mark.slow
@pytest.mark.one_worker_group("cpu_mode_probes")
def test_selected_mode_polls_often_unless_the_caller_chose_and_patches_for_determinism(selected, unselected):
    assert {key: selected[key] for key in POLL_KEYS} == {
        "default": verl_patches.REPLAY_BUFFER_POLL_S, "async": verl_patches.REPLAY_BUFFER_POLL_S,
        "caller_keyword": 3.0, "caller_positional": 4.0, "seeded_uids": True, "ordered_batches": True,
    }  # fmt: skip
    chosen = _probe({"VERL_PLATFORM": "cpu", "VERL_EVIDENCE_CPU_POLL_S": "0.25"}, POLL_PROBE, marker="POLL")
    assert chosen["default"] == 0.25
    assert unselected["default"] == verl_patches.VERL_REPLAY_BUFFER_POLL_DEFAULT  # untouched when not selected
    assert not unselected["seeded_uids"] and not unselected["ordered_batches"]


@pytest.mark.slow
@pytest.mark.one_worker_group("cpu_mode_probes")
def test_mode_is_inactive_unless_selected(unselected):
    assert {key: value for key, value in unselected.items() if key not in POLL_KEYS} == {
        "hf_replica": False,
        "hf_adapter": False,
    }


# --- the rollout server, in-process on the tiny policy ---


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    from verl_evidence.local.tiny_models import tiny_causal_lm

    directory = tmp_path_factory.mktemp("policy")
    tiny_causal_lm(directory=directory)
    return directory


def _server(policy_dir, **config):
    rollout = SimpleNamespace(response_length=12, prompt_length=64, seed=0, **config)
    return cpu_rollout.HFRolloutServer(rollout, SimpleNamespace(local_path=str(policy_dir), trust_remote_code=False), 0)


def test_rollout_server_generates_with_its_weight_version_and_takes_new_weights(policy_dir):
    import torch

    from verl_evidence.local.tiny_models import tiny_causal_lm

    server = _server(policy_dir)
    greedy = {"temperature": 0.0, "logprobs": True}
    prompt = [5, 6, 7, 8]

    async def scenario():
        before = await server.generate(prompt, dict(greedy), "r1")
        assert 0 < len(before.token_ids) <= 12  # response_length is the default budget, as in verl's vLLM server
        assert len(before.log_probs) == len(before.token_ids)
        assert before.extra_fields == {"global_steps": None}
        state = tiny_causal_lm(seed=1).state_dict()  # other weights, ties intact (lm_head is embed_tokens)
        assert await server.load_weights(state) == len(state)
        await server.set_global_steps(3)
        after = await server.generate(prompt, dict(greedy), "r2")
        assert after.extra_fields == {"global_steps": 3}
        assert torch.equal(
            server.backend.model.state_dict()["model.embed_tokens.weight"], state["model.embed_tokens.weight"]
        )
        return before, after

    before, after = asyncio.run(scenario())
    assert before.log_probs != after.log_probs  # generation really uses the new weights
    assert asyncio.run(server.describe()) == {"replica_rank": 0, "global_steps": 3, "weight_syncs": 1}


def test_rollout_server_refuses_weights_it_does_not_have(policy_dir):
    import torch

    server = _server(policy_dir)
    with pytest.raises(KeyError, match="unknown parameters.*not_a_layer"):
        asyncio.run(server.load_weights({"not_a_layer.weight": torch.zeros(1)}))


def test_rollout_server_caps_the_budget_by_the_context_left(policy_dir):
    server = _server(policy_dir)
    long_prompt = list(range(5, 5 + 70))  # prompt_length + response_length - 70 = 6 tokens left
    output = asyncio.run(server.generate(long_prompt, {"temperature": 0.0, "ignore_eos": True}, "r"))
    assert len(output.token_ids) == 6
