"""Scorers: one decoded :class:`Sample` in, a dict of floats with a fixed key set out.

The reward managers and the composite manager share these, so each method's
adapter logic exists once. A scorer never raises: a failure gives score 0,
every component key at 0 and ``reward_error = 1``, with the reason logged.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl_evidence.reward_managers.judge import JudgeClient, JudgeConfig, connect_judge
from verl_evidence.reward_managers.sample import Sample
from verl_evidence.rewards import evinote, eviomni, grace
from verl_evidence.text.ground_truth import coerce_ground_truth

logger = logging.getLogger(__name__)

ERROR_KEY = "reward_error"
# Keys of reward_kwargs read by the adapters themselves, never forwarded to a reward core.
ADAPTER_KEYS = frozenset({"components", "validation_splits"})
DEFAULT_VALIDATION_SPLITS = ("test", "val", "valid", "validation", "dev")
# extra_info key carrying the trainer's phase, written by verl_evidence.reward_managers.phase.PhaseAgentLoopManager
PHASE_KEY = "trainer_phase"
TRAIN_PHASE, VALIDATION_PHASE = "train", "validation"
PHASE_MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
# Stand-in inputs for the start-up call that checks a core's keyword arguments.
_PROBE_GROUND_TRUTH = {"target": ["probe"], "evidence": ["probe"], "answerable": True}


def core_kwargs(reward_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """reward_kwargs minus the adapters' own keys (``nli_*``, ``components``, ...)."""
    return {
        key: value
        for key, value in reward_kwargs.items()
        if key not in ADAPTER_KEYS and not key.startswith(JudgeConfig.PREFIX)
    }


class Scorer(ABC):
    """Turns a sample into ``{"score", <component keys>..., "reward_error"}``."""

    def __init__(self, name: str, keys: Sequence[str]) -> None:
        self.name = name
        component_keys = [key for key in keys if key not in ("score", ERROR_KEY)]
        self.keys: tuple[str, ...] = ("score", *component_keys, ERROR_KEY)

    @abstractmethod
    async def _score(self, sample: Sample) -> Mapping[str, Any] | float:
        """The core result for one sample (may raise; :meth:`score` contains it)."""

    def failure(self) -> dict[str, float]:
        result = dict.fromkeys(self.keys, 0.0)
        result[ERROR_KEY] = 1.0
        return result

    def normalize(self, result: Mapping[str, Any] | float) -> dict[str, float]:
        """The fixed key set as floats; missing components read 0, extra ones are dropped."""
        if not isinstance(result, Mapping):
            result = {"score": result}
        normalized = {key: float(result.get(key, 0.0)) for key in self.keys if key != ERROR_KEY}
        if not math.isfinite(normalized["score"]):
            raise ValueError(f"non-finite score {normalized['score']!r}")
        normalized[ERROR_KEY] = float(result.get(ERROR_KEY, 0.0))
        return normalized

    async def score(self, sample: Sample) -> dict[str, float]:
        try:
            return self.normalize(await self._score(sample))
        except Exception as error:
            logger.warning(
                "%s reward failed for data_source=%r (%s: %s); scoring 0",
                self.name,
                sample.data_source,
                type(error).__name__,
                error,
            )
            return self.failure()


class FunctionScorer(Scorer):
    """A verl-style ``compute_score`` function, sync (run in the executor) or async."""

    def __init__(
        self,
        name: str,
        function: Callable[..., Any],
        keys: Sequence[str] = ("score",),
        kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name, keys)
        self.function = function
        self.kwargs = dict(kwargs or {})
        self.is_async = inspect.iscoroutinefunction(function)

    def prepare_extra_info(self, sample: Sample) -> dict[str, Any]:
        return sample.extra_info

    async def call(self, sample: Sample, extra_info: dict[str, Any]) -> Any:
        arguments = dict(
            data_source=sample.data_source,
            solution_str=sample.solution_str,
            ground_truth=sample.ground_truth,
            extra_info=extra_info,
            **self.kwargs,
        )
        if self.is_async:
            return await self.function(**arguments)
        return await asyncio.get_running_loop().run_in_executor(None, lambda: self.function(**arguments))

    async def _score(self, sample: Sample) -> Mapping[str, Any] | float:
        return await self.call(sample, self.prepare_extra_info(sample))

    def probe(self) -> None:
        """Call a pure core once at start-up so bad keyword arguments fail the job, not every sample."""
        self.function(
            data_source="probe", solution_str="", ground_truth=_PROBE_GROUND_TRUTH, extra_info={}, **self.kwargs
        )


class EviOmniScorer(FunctionScorer):
    """EviOmni/LEAR: o_r, o_e and the token lengths come from ``tool_extra_fields``."""

    def __init__(self, kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__("eviomni", eviomni.compute_score, eviomni.RESULT_KEYS, kwargs)
        self.probe()


class GraceScorer(FunctionScorer):
    """GRACE, with the validation defaults (alpha = beta = 1) on validation samples.

    A sample is a validation sample when the trainer generated it in its
    validation phase: ``extra_info["trainer_phase"]``, written by
    :class:`verl_evidence.reward_managers.phase.PhaseAgentLoopManager` (verl 0.9
    does not pass the phase to reward managers itself). Without that manager,
    the row's ``extra_info["validate"]`` decides, else its ``extra_info["split"]``
    (in ``validation_splits``, default test/val/valid/validation/dev), with a
    warning, once, that the data file rather than the trainer decided.
    ``mode=train|validation`` in the kwargs forces one mode for every sample.
    """

    def __init__(
        self,
        kwargs: Mapping[str, Any] | None = None,
        validation_splits: Sequence[str] = DEFAULT_VALIDATION_SPLITS,
    ) -> None:
        super().__init__("grace", grace.compute_score, grace.RESULT_KEYS, kwargs)
        self.validation_splits = frozenset(str(split).lower() for split in validation_splits)
        self.warned_no_phase = False
        grace.config_from_kwargs(self.kwargs)  # bad mode/alpha/beta fail at start-up
        self.probe()

    def prepare_extra_info(self, sample: Sample) -> dict[str, Any]:
        extra_info = sample.extra_info
        phase = extra_info.get(PHASE_KEY)
        if phase in (TRAIN_PHASE, VALIDATION_PHASE):
            return {**extra_info, "validate": phase == VALIDATION_PHASE}
        if not self.warned_no_phase:
            self.warned_no_phase = True
            logger.warning(
                "grace reward: the trainer's phase is unknown (set %s=%s); the data rows' "
                "extra_info.validate / split decide whether validation weights apply",
                PHASE_MANAGER_KEY,
                "verl_evidence.reward_managers.phase.PhaseAgentLoopManager",
            )
        if "validate" not in extra_info:
            split = extra_info.get("split")
            extra_info = {**extra_info, "validate": isinstance(split, str) and split.lower() in self.validation_splits}
        return extra_info


class EviNoteScorer(FunctionScorer):
    """EviNote: EQR from the NLI judge on (last note, claim), then the gated reward.

    A setting without EQR (``eqr: false``, the paper's ablations) needs no judge: ``judge`` is None then.
    """

    def __init__(self, kwargs: Mapping[str, Any] | None, judge: JudgeClient | None) -> None:
        super().__init__("evinote", evinote.compute_score, evinote.RESULT_KEYS, kwargs)
        self.config = evinote.config_from_kwargs(self.kwargs)  # bad markers/template fail at start-up
        self.judge = judge
        self.probe()

    def claim_and_premise(self, sample: Sample) -> tuple[str, str] | None:
        """(premise, hypothesis), or None when EQR is 0 by definition (no note or no gold answer)."""
        premise = evinote.last_summary(sample.solution_str, self.config.note_tag)
        golds = coerce_ground_truth(sample.ground_truth)["target"]
        if not premise.strip() or not golds:
            return None
        return premise, evinote.build_claim(golds[0], sample.question(), self.config.claim_template)

    async def _score(self, sample: Sample) -> Mapping[str, Any] | float:
        pair = self.claim_and_premise(sample) if self.config.eqr else None
        eqr = 0.0
        if pair is not None:
            (eqr,) = await self.judge.entailment_probs([pair[0]], [pair[1]])
        # the question seeds Force Summary + Stochastic Reward's coin (a trajectory draws the same on every run)
        return await self.call(sample, {**sample.extra_info, "eqr": float(eqr), "question": sample.question()})


BUILTIN_REWARDS = ("eviomni", "evinote", "grace")
_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def load_function(spec: str) -> Callable[..., Any]:
    """``pkg://my.module:fn``, ``my.module:fn``, ``/path/file.py:fn`` (``:fn`` defaults to ``compute_score``)."""
    from verl.utils.import_utils import load_extern_object

    module_path, function_name = spec, "compute_score"
    head, sep, tail = spec.rpartition(":")
    if sep and _IDENTIFIER_RE.match(tail) and head and not head.endswith(":/"):
        module_path, function_name = head, tail
    is_file = module_path.startswith("file://") or module_path.endswith(".py") or os.sep in module_path
    if not module_path.startswith("pkg://") and not is_file:
        module_path = "pkg://" + module_path
    try:
        function = load_extern_object(module_path=module_path, object_name=function_name)
    except Exception as error:
        raise ValueError(f"cannot load reward function {spec!r} ({module_path}, {function_name}): {error}") from error
    if not callable(function):
        raise ValueError(f"reward function {spec!r} is not callable")
    return function


def build_scorer(
    reward: str,
    kwargs: Mapping[str, Any] | None = None,
    judge_kwargs: Mapping[str, Any] | None = None,
    keys: Sequence[str] = ("score",),
) -> Scorer:
    """A scorer for a built-in reward name or an importable ``compute_score`` function.

    ``kwargs`` go to the reward core (adapter keys removed); ``judge_kwargs``
    (``nli_*``) configure EviNote's NLI judge; ``keys`` lists the result keys a
    custom function returns that should be logged besides ``score``.
    """
    kwargs = dict(kwargs or {})
    validation_splits = kwargs.get("validation_splits", DEFAULT_VALIDATION_SPLITS)
    if isinstance(validation_splits, str):
        validation_splits = [validation_splits]
    forwarded = core_kwargs(kwargs)
    if reward == "eviomni":
        return EviOmniScorer(forwarded)
    if reward == "grace":
        return GraceScorer(forwarded, validation_splits)
    if reward == "evinote":
        if not evinote.config_from_kwargs(forwarded).eqr:
            return EviNoteScorer(forwarded, None)  # an ablation without EQR: no judge to start
        judge_settings = {**(judge_kwargs or {}), **{k: v for k, v in kwargs.items() if k.startswith("nli_")}}
        return EviNoteScorer(forwarded, connect_judge(JudgeConfig.from_reward_kwargs(judge_settings)))
    if not isinstance(reward, str) or not reward:
        raise ValueError(f"reward must be one of {BUILTIN_REWARDS} or 'module:function', got {reward!r}")
    function = load_function(reward)
    return FunctionScorer(getattr(function, "__name__", reward), function, keys, forwarded)


WEIGHT_KEY = "weight"


class CompositeScorer(Scorer):
    """Weighted sum of component scorers; logs every component's keys as ``<label>.<key>``, and its weight
    as ``<label>.weight`` (constant per run: the per-step metrics then show what each part counts for).

    Components run concurrently; a failing component contributes 0 and sets
    ``reward_error`` (the others still count).
    """

    def __init__(self, components: Sequence[tuple[str, float, Scorer]]) -> None:
        if not components:
            raise ValueError("the composite reward needs at least one component")
        labels = [label for label, _, _ in components]
        if len(set(labels)) != len(labels):
            raise ValueError(f"composite component names must be unique, got {labels}")
        self.components = list(components)
        keys = [
            name
            for label, _, scorer in self.components
            for name in (*(f"{label}.{key}" for key in scorer.keys), f"{label}.{WEIGHT_KEY}")
        ]
        clash = [label for label, _, scorer in self.components if WEIGHT_KEY in scorer.keys]
        if clash:
            raise ValueError(f"composite components {clash} return a key {WEIGHT_KEY!r}, which the composite logs")
        super().__init__("composite", keys)

    def failure(self) -> dict[str, float]:
        result = super().failure()
        result.update({f"{label}.{WEIGHT_KEY}": weight for label, weight, _ in self.components})
        return result

    async def _score(self, sample: Sample) -> Mapping[str, Any] | float:
        results = await asyncio.gather(*(scorer.score(sample) for _, _, scorer in self.components))
        combined: dict[str, float] = {"score": 0.0, ERROR_KEY: 0.0}
        for (label, weight, _), result in zip(self.components, results):
            combined["score"] += weight * result["score"]
            combined[ERROR_KEY] = max(combined[ERROR_KEY], result[ERROR_KEY])
            combined.update({f"{label}.{key}": value for key, value in result.items()})
            combined[f"{label}.{WEIGHT_KEY}"] = weight
        return combined


_COMPONENT_FIELDS = frozenset({"reward", "weight", "kwargs", "name", "keys"})


def build_composite(
    components: Any,
    judge_kwargs: Mapping[str, Any] | None = None,
    custom_function: Callable[..., Any] | None = None,
) -> CompositeScorer:
    """A :class:`CompositeScorer` from the YAML list ``[{reward, weight, kwargs, name, keys}, ...]``.

    ``reward``: eviomni | evinote | grace | custom (verl's
    ``reward.custom_reward_function``) | ``module:function``. ``weight``
    defaults to 1, ``name`` (the log prefix) to the reward name, numbered when
    repeated.
    """
    if isinstance(components, Mapping) or not isinstance(components, Sequence) or isinstance(components, str):
        raise ValueError(
            f"reward_kwargs.components must be a list like [{{reward: eviomni, weight: 0.5}}, ...], got {components!r}"
        )
    built: list[tuple[str, float, Scorer]] = []
    used: dict[str, int] = {}
    for position, component in enumerate(components):
        if not isinstance(component, Mapping) or "reward" not in component:
            raise ValueError(f"composite component {position} must be a mapping with a 'reward' key, got {component!r}")
        unknown = sorted(set(component) - _COMPONENT_FIELDS)
        if unknown:
            raise ValueError(
                f"composite component {position} has unknown fields {unknown}; known {sorted(_COMPONENT_FIELDS)}"
            )
        reward = str(component["reward"])
        weight = component.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(
                f"composite component {position} ({reward}) weight must be a finite number, got {weight!r}"
            )
        kwargs = dict(component.get("kwargs") or {})
        if reward == "custom":
            if custom_function is None:
                raise ValueError("composite component 'custom' needs reward.custom_reward_function.path to be set")
            scorer: Scorer = FunctionScorer("custom", custom_function, component.get("keys") or ("score",), kwargs)
            default_label = "custom"
        else:
            scorer = build_scorer(reward, kwargs, judge_kwargs, component.get("keys") or ("score",))
            default_label = reward if reward in BUILTIN_REWARDS else scorer.name
        label = str(component.get("name") or default_label)
        if component.get("name") is None:
            used[label] = used.get(label, 0) + 1
            if used[label] > 1:
                label = f"{label}_{used[label]}"
        built.append((label, float(weight), scorer))
    return CompositeScorer(built)
