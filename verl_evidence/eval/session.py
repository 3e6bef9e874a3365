"""Everything an evaluation run needs, set up once and torn down cleanly.

:func:`open_session` starts (or points at) the retrieval server, picks the
policy tokenizer, composes verl's trainer config with the agent loops' settings,
builds the reward-loop workers (with the EviNote judge) and yields an
:class:`EvalSession`. :func:`make_runner` then binds a policy to it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_evidence.eval.runner import DEFAULT_MANAGERS_BY_ROLLOUT, EvalExample, EvalRunner, PolicySpec
from verl_evidence.eval.scoring import RewardScorer, compose_trainer_config

logger = logging.getLogger(__name__)

__all__ = ["RANDOM_JUDGE_NOTE", "EvalSession", "make_runner", "open_session", "replay_backend", "reward_managers"]

RANDOM_JUDGE_NOTE = (
    "EviNote's NLI judge is a tiny RANDOMLY INITIALISED model built locally (no --nli-model given): "
    "its EQR values are meaningless noise. The gate of the EviNote reward (1 / 0.1 / 0 for correct / "
    "wrong-with-notes / bad format) is real. Pass --nli-model <NLI model dir or hub name> for real EQR."
)

# The composite manager of the evaluation: EviNote plus an answer-F1 term (a combination none of
# the papers' code bases offers), scoring the search rollouts.
COMPOSITE_COMPONENTS = [
    {"reward": "evinote", "weight": 1.0},
    {"reward": "verl_evidence.rewards.answer:answer_f1", "weight": 0.5, "name": "answer_f1"},
]


def reward_managers(nli_model: str, nli_device: str = "cpu") -> dict[str, tuple[str, dict[str, Any]]]:
    """Label -> (registered manager name, reward_kwargs) for every manager the evaluation runs."""
    judge = {"nli_model": nli_model, "nli_in_process": True, "nli_device": nli_device}
    return {
        "evinote": ("evinote", dict(judge)),
        "composite": ("composite", {"components": COMPOSITE_COMPONENTS, **judge}),
        "eviomni": ("eviomni", {}),
        "grace": ("grace", {}),
    }


@dataclass
class EvalSession:
    work_dir: Path
    tokenizer: Any
    tokenizer_dir: Path
    config: DictConfig
    retrieval_url: str
    scorer: RewardScorer | None
    notes: list[str] = field(default_factory=list)


def _set_loop_settings(
    config: DictConfig,
    retrieval_url: str,
    search_topk: int,
    max_turns: int,
    response_length: int,
    max_tokens_per_turn: int,
    search_settings: Mapping[str, Any] | None = None,
) -> None:
    """Point both agent loops at the server (``actor_rollout_ref.rollout.custom.<loop>``).

    ``search_settings`` are further ``evidence_search`` settings (e.g. an EviPath planner's layout).
    """
    with open_dict(config):
        rollout = config.actor_rollout_ref.rollout
        custom = OmegaConf.to_container(rollout.custom, resolve=True) if rollout.get("custom") else {}
        custom = dict(custom or {})
        custom["evidence_search"] = {
            **custom.get("evidence_search", {}),
            "retrieval_url": retrieval_url,
            "topk": search_topk,
            "max_turns": max_turns,
            "max_tokens_per_turn": max_tokens_per_turn,
            **dict(search_settings or {}),
        }
        custom["eviomni"] = {**custom.get("eviomni", {}), "retrieval_url": retrieval_url}
        rollout.custom = OmegaConf.create(custom)
        # Room for passages in the prompt and several search turns with their <information> blocks
        # (the trainer's defaults, 512 each, would truncate them).
        rollout.prompt_length = max(int(rollout.prompt_length), 8192)
        rollout.response_length = int(response_length)


def policy_tokenizer_dir(tokenizer: str | Path) -> tuple[Path, str | None]:
    """``--tokenizer`` as a directory: itself, or for ``qwen2.5`` / ``qwen3`` / a Qwen2.5/Qwen3 model whose tokenizer is
    not on this machine, Qwen's vocabulary built offline, with the line that says so."""
    from verl_evidence.local.qwen_tokenizer import describe_stand_in, qwen_tokenizer_dir, stand_in_family

    family = stand_in_family(str(tokenizer))
    if family is None:
        return Path(tokenizer), None
    return qwen_tokenizer_dir(family), describe_stand_in(family, str(tokenizer))


@contextmanager
def open_session(
    work_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    retrieval_url: str | None = None,
    nli_model: str | None = None,
    nli_device: str = "cpu",
    search_topk: int = 3,
    max_turns: int = 4,
    response_length: int = 4096,
    max_tokens_per_turn: int = 512,
    score: bool = True,
    config_overrides: Sequence[str] = (),
    managers: Mapping[str, tuple[str, Mapping[str, Any]]] | None = None,
    search_settings: Mapping[str, Any] | None = None,
) -> Iterator[EvalSession]:
    """Set up server, tokenizer, verl config and reward workers; stop the server we started on exit.

    ``tokenizer_dir`` None uses the lossless offline test tokenizer (right for
    replayed texts); ``retrieval_url`` None starts the embedded default
    server (bundled corpus, packaged MiniLM) on 127.0.0.1; ``nli_model`` None
    builds a tiny random NLI judge and adds :data:`RANDOM_JUDGE_NOTE` to the notes.
    ``response_length`` caps a whole trajectory (all turns and observations),
    ``max_tokens_per_turn`` one generation of the search loop; ``search_settings``
    are further ``evidence_search`` settings (:data:`~verl_evidence.agent_loops.search_loop_settings.EVIPATH_SETTINGS`).
    """
    from transformers import AutoTokenizer

    import verl_evidence.plugin  # noqa: F401  (registers the agent loops and reward managers in this process)
    from verl_evidence.local.tiny_models import save_tiny_tokenizer, tiny_nli_model

    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    if tokenizer_dir is None:
        tokenizer_dir = save_tiny_tokenizer(work / "tokenizer")
        notes.append("Token counts (L_r, L_e, L_P, context tokens) use the offline test tokenizer (byte-level BPE).")
    else:
        tokenizer_dir, stand_in = policy_tokenizer_dir(tokenizer_dir)
        if stand_in:
            notes.append(f"Token counts (L_r, L_e, L_P, context tokens): {stand_in}.")
            logger.info(stand_in)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if score and nli_model is None:
        nli_model = str(tiny_nli_model(work / "random-nli"))
        notes.append(RANDOM_JUDGE_NOTE)
        logger.info(RANDOM_JUDGE_NOTE)

    handle = None
    if retrieval_url is None:
        from retrieval_server.launch import default_server_config, start_server
        from verl_evidence import bundled

        handle = start_server(default_server_config(bundled.corpus_path(), port=0))
        retrieval_url = handle.url
        notes.append(
            f"Retrieval: embedded default server (bundled corpus, packaged MiniLM, Flat index) at {retrieval_url}."
        )
    else:
        notes.append(f"Retrieval: server at {retrieval_url}.")
    try:
        config = compose_trainer_config(tokenizer_dir, config_overrides)
        _set_loop_settings(
            config, retrieval_url, search_topk, max_turns, response_length, max_tokens_per_turn, search_settings
        )
        scorer = None
        if score:
            scorer = RewardScorer(tokenizer_dir, managers or reward_managers(nli_model, nli_device), base_config=config)
        yield EvalSession(
            work_dir=work,
            tokenizer=tokenizer,
            tokenizer_dir=Path(tokenizer_dir),
            config=config,
            retrieval_url=retrieval_url,
            scorer=scorer,
            notes=notes,
        )
    finally:
        if handle is not None:
            handle.shutdown()


def replay_backend(example: EvalExample, tokenizer: Any):
    """A :class:`~verl_evidence.local.backends.ScriptedBackend` that replays ``example.script``.

    Loops that generate one turn after another (search, GRACE) consume the
    script in order. The EviOmni loop generates o_r, o_e and o_f concurrently,
    so its script is ``[reason+extract, o_f, o_r, o_e]`` and each call is
    matched by what its prompt contains: the continuation of the first turn (its
    prompt extended) is o_f, a prompt that still shows the rationale is o_r, the
    remaining one o_e. Not "a prompt ending in ``</extract>``": the token that
    completes the tag may carry the next characters (Qwen's ``'><'``).
    """
    from verl_evidence.local.backends import ScriptedBackend
    from verl_evidence.text.tags import extract_last

    script = list(example.script or [])
    if example.rollout != "eviomni":
        return ScriptedBackend(tokenizer, turns=script)
    if len(script) != 4:
        raise ValueError(f"{example.example_id}: an EviOmni replay needs 4 texts [reason+extract, o_f, o_r, o_e]")
    first, answer_f, answer_r, answer_e = script
    rationale = extract_last(first, "reason") or ""
    state: dict[str, Any] = {"calls": 0, "first_prompt": None}

    def respond(prompt: str) -> str:
        state["calls"] += 1
        if state["calls"] == 1:
            state["first_prompt"] = prompt
            return first
        if prompt != state["first_prompt"] and prompt.startswith(state["first_prompt"]):
            return answer_f
        if rationale and rationale in prompt:
            return answer_r
        return answer_e

    return ScriptedBackend(tokenizer, responder=respond)


def make_runner(
    session: EvalSession,
    policy: PolicySpec,
    concurrency: int = 4,
    managers_by_rollout: Mapping[str, Sequence[str]] | None = None,
) -> EvalRunner:
    """An :class:`EvalRunner` generating with ``policy`` inside ``session``."""
    if policy.kind == "replay":

        def backend_for(example: EvalExample):
            return replay_backend(example, session.tokenizer)

    elif policy.kind == "hf":
        from verl_evidence.local.backends import HFGenerationBackend

        backend = HFGenerationBackend.from_pretrained(policy.target)

        def backend_for(example: EvalExample):
            return backend

        concurrency = 1  # HF generate is not re-entrant; the backend serialises anyway
    else:
        from verl_evidence.local.backends import OpenAIBackend

        backend = OpenAIBackend(policy.target, policy.model_name, tokenizer=session.tokenizer)

        def backend_for(example: EvalExample):
            return backend

    return EvalRunner(
        config=session.config,
        tokenizer=session.tokenizer,
        policy_id=policy.policy_id,
        backend_for=backend_for,
        scorer=session.scorer,
        managers_by_rollout=dict(managers_by_rollout or DEFAULT_MANAGERS_BY_ROLLOUT),
        concurrency=concurrency,
    )
