"""Pieces shared by the search and EviOmni agent loops: settings, questions, generation calls."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import weakref
from typing import Any, NamedTuple
from uuid import uuid4

from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger(__name__)

CUSTOM_SECTION = "custom"  # actor_rollout_ref.rollout.custom.<loop name>.<key>


def resolve_settings(settings_cls: type, rollout_config: Any, loop_name: str, overrides: dict[str, Any]):
    """Build a loop's settings dataclass: defaults < ``rollout.custom.<loop_name>`` < loop kwargs.

    The loop kwargs are the extra keys of the loop's entry in
    ``rollout.agent.agent_loop_config_path`` (hydra passes them to the
    constructor). Unknown keys fail here, at the first rollout, naming the key.
    """
    merged: dict[str, Any] = {}
    custom = rollout_config.get(CUSTOM_SECTION) if rollout_config is not None else None
    if custom:
        section = custom.get(loop_name) if hasattr(custom, "get") else None
        if section:
            merged.update(OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else section)
    for key, value in overrides.items():
        if key == "name":  # verl passes an agent_loop_config_path entry whole, its `name` included
            continue
        merged[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
    known = {f.name for f in dataclasses.fields(settings_cls)}
    unknown = sorted(set(merged) - known)
    if unknown:
        raise TypeError(f"unknown setting(s) {unknown} for agent loop {loop_name!r}; known: {sorted(known)}")
    return settings_cls(**merged)


class LoopSetup(NamedTuple):
    settings: Any
    response_length: int
    rollout_name: str | None


_SETUP_CACHE: dict[tuple[int, str, str], tuple[weakref.ref, LoopSetup]] = {}


def loop_setup(trainer_config: Any, settings_cls: type, loop_name: str, overrides: dict[str, Any]) -> LoopSetup:
    """Settings and the rollout values a loop needs, resolved once per worker config.

    verl builds a loop object per trajectory, and reading interpolated
    OmegaConf values (``response_length`` is ``${oc.select:...}``) costs
    milliseconds each time; the worker's config object never changes, so the
    result is cached by its identity. Settings are frozen dataclasses, safe to share.
    """
    key = (id(trainer_config), loop_name, repr(sorted(overrides.items())))
    hit = _SETUP_CACHE.get(key)
    if hit is not None and hit[0]() is trainer_config:
        return hit[1]
    rollout = trainer_config.actor_rollout_ref.rollout
    setup = LoopSetup(
        settings=resolve_settings(settings_cls, rollout, loop_name, overrides),
        response_length=int(rollout.response_length),
        rollout_name=rollout.get("name"),
    )
    _SETUP_CACHE[key] = (weakref.ref(trainer_config), setup)
    return setup


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def message_text(content: Any) -> str:
    """Text of a chat message's content (a string, or a list of typed parts)."""
    content = _plain(content)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def question_of(kwargs: dict[str, Any]) -> str:
    """The question of a dataset row: ``extra_info.question`` if present, else the last user message."""
    extra_info = _plain(kwargs.get("extra_info")) or {}
    if isinstance(extra_info, dict) and isinstance(extra_info.get("question"), str) and extra_info["question"]:
        return extra_info["question"]
    messages = [_plain(m) for m in _plain(kwargs.get("raw_prompt")) or []]
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return message_text(message.get("content")).strip()
    return ""


def row_passages(kwargs: dict[str, Any]) -> list[dict] | None:
    """Passages given with the row (``extra_info.passages``: strings or ``{"id","contents"}`` dicts)."""
    extra_info = _plain(kwargs.get("extra_info")) or {}
    passages = _plain(extra_info.get("passages")) if isinstance(extra_info, dict) else None
    if not passages:
        return None
    out = []
    for index, passage in enumerate(passages):
        if isinstance(passage, str):
            out.append({"document": {"id": f"row-{index}", "contents": passage}})
        elif isinstance(passage, dict):
            document = passage.get("document", passage)
            out.append({"document": {"id": str(document.get("id", f"row-{index}")), "contents": document["contents"]}})
    return out


@functools.lru_cache(maxsize=32)
def _encoder(tokenizer_id: int, tokenizer):  # tokenizer is hashable by identity
    return functools.lru_cache(maxsize=256)(lambda text: tuple(tokenizer.encode(text, add_special_tokens=False)))


def encode_cached(tokenizer, text: str) -> list[int]:
    """Token ids of a fixed piece of text (tags, feedback messages) — cached, they repeat every turn."""
    return list(_encoder(id(tokenizer), tokenizer)(text))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def stop_sampling_params(
    sampling_params: dict[str, Any], rollout_name: str | None, stops: list[str], max_tokens: int
) -> dict[str, Any]:
    """Copy of ``sampling_params`` that stops after any of ``stops`` and keeps the stop text.

    vLLM drops the stop string from its text unless ``include_stop_str_in_output``;
    SGLang trims it unless ``no_stop_trim``. Either engine rejects the other's
    flag, so only the one for the configured engine is set.
    """
    params = dict(sampling_params)
    params["stop"] = list(stops)
    params["max_tokens"] = int(max_tokens)
    params.pop("max_new_tokens", None)
    if rollout_name == "sglang":
        params["no_stop_trim"] = True
    else:
        params["include_stop_str_in_output"] = True
    return params


# Keys verl's rollout servers and server client put in each generation's ``extra_fields``
# that the trainer reads back per trajectory (verl/workers/rollout/llm_server.py; the v1
# trainer casts min/max_global_steps to int, so a trajectory without them ends the run).
WEIGHT_VERSION_KEYS = ("global_steps", "min_global_steps", "max_global_steps")
SPEC_DECODE_KEYS = ("spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")


class EngineFields:
    """The engine's per-generation ``extra_fields``, merged over every generation of one trajectory.

    As verl's own ToolAgentLoop does: the first generation's fields are kept as
    they are; later generations widen the weight-version range (the smallest
    ``min_global_steps``, the largest ``max_global_steps``; our loops may run
    generations concurrently, so first is not always oldest) and add up
    speculative-decoding counters. The loop's own fields go on top.
    """

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}

    def add(self, output: Any) -> None:
        new = dict(getattr(output, "extra_fields", None) or {})
        if not self.fields:
            self.fields = new
            return
        low, high = new.get("min_global_steps"), new.get("max_global_steps")
        if low is not None:
            current = self.fields.get("min_global_steps")
            self.fields["min_global_steps"] = low if current is None else min(current, low)
        if high is not None:
            current = self.fields.get("max_global_steps")
            self.fields["max_global_steps"] = high if current is None else max(current, high)
            self.fields["global_steps"] = self.fields["max_global_steps"]
        for key in SPEC_DECODE_KEYS:
            if key in new and key in self.fields:
                self.fields[key] = int(self.fields[key]) + int(new[key])

    def merged_with(self, own: dict[str, Any]) -> dict[str, Any]:
        return {**self.fields, **own}


def seeded_by_trajectory(
    params: dict[str, Any], rollout_config: Any, rollout_name: str | None, trajectory_ids: list[int], part: str
) -> dict[str, Any]:
    """``params`` of a side generation (one whose reply is not the trajectory's continuation) with a ``seed`` of its
    own under ``rollout.full_determinism``: from the rollout seed, ``part`` and the trajectory so far.

    Why: such a prompt can be shared by trajectories whose responses differ (EviOmni's answer without the evidence:
    two samples with one rationale and different evidence). An engine that seeds by prompt and arrival (our CPU
    engine) or one seed for all (verl's vLLM server) would let them trade replies, and each sample's reward would
    change from run to run. Seeded by its trajectory, a reply belongs to its sample; identical trajectories get
    identical replies, as under verl's one seed. SGLang names its seed otherwise and is left unseeded. Outside full
    determinism nothing is seeded: the engine samples as it would."""
    if not getattr(rollout_config, "full_determinism", False) or rollout_name == "sglang":
        return params
    base = getattr(rollout_config, "seed", 0)
    digest = hashlib.blake2b(f"{base}|{part}|{list(trajectory_ids)}".encode(), digest_size=8).digest()
    return {**params, "seed": int.from_bytes(digest, "little") & 0x7FFFFFFF}  # 31 bits: any engine's seed type


def request_id(rollout_config: Any, priority: int, part: str = "") -> str:
    """A generation request's id, as verl's own agent loops make it: ``det-<priority>`` under
    ``rollout.full_determinism`` (verl's router then sends equal ids to the same replica in every run, where it
    would pick the least loaded one), a fresh uuid otherwise. ``part`` tells a sample's concurrent requests apart."""
    if getattr(rollout_config, "full_determinism", False):
        return f"det-{priority}" + (f"-{part}" if part else "")
    return uuid4().hex
