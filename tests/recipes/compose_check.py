"""Compose recipe command lines with verl's real Hydra config and resolve every name they use.

Run as a script in a FRESH interpreter (the tests do): ``import verl`` then loads
the ``verl.plugins`` entry points exactly as the trainer does, so a manager,
estimator or agent loop that only registers when imported by hand is caught.

stdin: JSON list of ``{"argv": [trainer argv after "-m verl.trainer.main_ppo"], "score": [samples]}``
(``score`` optional: each sample ``{response, ground_truth, extra_info}`` is scored by the composed config's own
reward manager, built by verl's ``RewardLoopWorker`` as the trainer builds it).
stdout: JSON list of per-command reports (``ok`` plus the resolved names and ``scores``, or ``error``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback


def split_hydra_argv(argv: list[str]) -> tuple[str, str, list[str]]:
    config_path = config_name = None
    overrides = []
    for arg in argv:
        if arg.startswith("--config-path="):
            config_path = arg.split("=", 1)[1]
        elif arg.startswith("--config-name="):
            config_name = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    if config_path is None or config_name is None:
        raise ValueError("the recipe command has no --config-path/--config-name")
    return config_path, config_name, overrides


def build_manager(cfg) -> str:
    """Construct the reward manager as the reward loop does, so bad reward kwargs fail here.

    EviNote's judge is a Ray actor created at construction; without a cluster its
    settings are validated instead (model loading is the judge's own tests' job).
    """
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import load_reward_manager

    from verl_evidence.local.tiny_models import tiny_tokenizer

    components = (cfg.reward.get("reward_kwargs") or {}).get("components") or []
    if cfg.reward.reward_manager.name == "evinote" or any(c.get("reward") == "evinote" for c in components):
        from verl_evidence.reward_managers.judge import JudgeConfig

        kwargs = OmegaConf.to_container(cfg.reward.get("reward_kwargs") or {}, resolve=True)
        return f"judge settings ok: {JudgeConfig.from_reward_kwargs(kwargs).model}"
    return type(load_reward_manager(cfg, tiny_tokenizer())).__name__


def loop_settings_classes() -> dict[str, type]:
    from verl_evidence.agent_loops.eviomni_loop import EviOmniLoopSettings
    from verl_evidence.agent_loops.search_loop_settings import SearchLoopSettings

    return {"evidence_search": SearchLoopSettings, "eviomni": EviOmniLoopSettings}


def check_loop_settings(rollout_config) -> list[str]:
    """Build every `rollout.custom.<loop>` section as the loop does at its first rollout (unknown keys fail)."""
    from verl_evidence.agent_loops.common import resolve_settings

    classes = loop_settings_classes()
    custom = rollout_config.get("custom") or {}
    for loop_name in custom:
        if loop_name not in classes:
            raise KeyError(f"rollout.custom.{loop_name}: no such plugin agent loop ({sorted(classes)})")
        resolve_settings(classes[loop_name], rollout_config, loop_name, {})
    return sorted(custom)


def score_samples(cfg, samples: list[dict]) -> list[dict[str, float]]:
    """Score samples with the reward manager the composed config selects, through verl's RewardLoopWorker.

    Only the tokenizer path changes (the tiny tokenizer: no hub download); every reward setting is the recipe's.
    """
    import asyncio
    import tempfile

    from omegaconf import open_dict
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from verl_evidence.eval.scoring import build_reward_dataproto, numeric_components
    from verl_evidence.local.tiny_models import save_tiny_tokenizer, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer_dir = tempfile.TemporaryDirectory(prefix="compose_check_tok_")  # removed when scoring ends
    with open_dict(cfg):
        cfg.actor_rollout_ref.model.path = str(save_tiny_tokenizer(tokenizer_dir.name))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # verl's managers cache the thread's loop when built
    try:
        worker = RewardLoopWorker(cfg)
        scores = []
        for sample in samples:
            row = {
                "data_source": sample.get("data_source", "nq"),
                "reward_model": {"style": "rule", "ground_truth": sample["ground_truth"]},
                "extra_info": sample.get("extra_info", {}),
                "raw_prompt": [{"role": "user", "content": sample.get("prompt", "Question?")}],
            }
            data = build_reward_dataproto(
                tokenizer.encode(sample.get("prompt", "Question?")), tokenizer.encode(sample["response"]), row, {}, 1
            )
            scores.append(numeric_components(loop.run_until_complete(worker.compute_score(data))))
        return scores
    finally:
        loop.close()
        tokenizer_dir.cleanup()


def check(argv: list[str], samples: list[dict] | None = None) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.reward import get_custom_reward_fn, resolve_reward_manager_cls
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    config_path, config_name, overrides = split_hydra_argv(argv)
    with initialize_config_dir(config_dir=config_path, version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ValueError(f"missing required values: {missing}")
    OmegaConf.resolve(cfg)  # every interpolation must resolve
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    # (verl 0.9.1 hands `algorithm` to the estimators as a DictConfig and never builds AlgoConfig
    # from it, so extra keys such as eps_std are legal there; not converted here either.)
    manager = resolve_reward_manager_cls(cfg)
    custom = get_custom_reward_fn(cfg)
    built = build_manager(cfg)
    loop_sections = check_loop_settings(cfg.actor_rollout_ref.rollout)
    estimator = get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    import verl.experimental.agent_loop  # noqa: F401  (registers verl's built-in loops)

    loop = cfg.actor_rollout_ref.rollout.agent.default_agent_loop
    if loop not in _agent_loop_registry:
        raise KeyError(f"agent loop {loop!r} not registered; registered: {sorted(_agent_loop_registry)}")
    tool_config = cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path
    tools = []
    if tool_config:
        from verl.tools.tool_registry import initialize_tools_from_config

        tools = [type(t).__name__ for t in initialize_tools_from_config(tool_config)]
    return {
        "ok": True,
        "manager": f"{manager.__module__}.{manager.__qualname__}",
        "custom_reward_fn": bool(custom),
        "built": built,
        "loop_settings": loop_sections,
        "estimator": getattr(estimator, "__name__", str(estimator)),
        "agent_loop": loop,
        "agent_loop_target": _agent_loop_registry[loop]["_target_"],
        "tools": tools,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "scores": score_samples(cfg, samples) if samples else [],
    }


def check_this_checkout() -> None:
    """Stop unless the plugin imports from the checkout this script belongs to (not another installed copy)."""
    from pathlib import Path

    import retrieval_server
    import verl_evidence

    checkout = Path(__file__).resolve().parents[2]
    for package in (verl_evidence, retrieval_server):
        location = Path(package.__file__).resolve().parent
        if location != checkout / package.__name__:
            sys.exit(f"compose_check: {package.__name__} imported from {location}, not from {checkout}")


def main() -> None:
    import verl  # noqa: F401  (loads the verl.plugins entry points, as the trainer does)

    check_this_checkout()
    reports = []
    with contextlib.redirect_stdout(sys.stderr):  # verl prints progress; stdout carries only the JSON
        for job in json.load(sys.stdin):
            try:
                reports.append(check(job["argv"], job.get("score")))
            except Exception as err:  # report every command, not just the first failure
                reports.append({"ok": False, "error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()})
    json.dump(reports, sys.stdout, default=str)


if __name__ == "__main__":
    main()
