"""Pre-flight check every RL recipe runs before its trainer: reward, rollout, data and devices must fit.

    python recipes/preflight.py --config-path=... --config-name=... key=value ...   # the trainer's own arguments

Composes the trainer's config with Hydra exactly as ``verl.trainer.main_ppo`` will, works out which reward
functions score the run (a manager's own, a custom function, each component of a composite) and checks what
each of them reads (:data:`REWARD_NEEDS`) against the rollout (the agent loop each row will run) and the rows of
every train/val parquet file; then that some prompt fits ``data.max_prompt_length`` and that the GPUs verl will
ask Ray for exist. Each problem is one ``error:`` line naming the file and what to do; any problem exits 2
before anything starts. A reward function the table does not know (a user's own) is checked against the
``requires:`` block of its reward preset; with none, the run is refused: a run this check cannot vouch for is
started only on request (PREFLIGHT=0).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROWS_CHECKED = 64  # the first rows of each file: enough to catch rows prepared for another method, read in ms

TARGET = "reward_model.ground_truth.target"
EVIDENCE = "reward_model.ground_truth.evidence"
ANSWERABLE = "reward_model.ground_truth.answerable"


@dataclass(frozen=True)
class FieldNeed:
    path: str  # dotted, from the row's top
    condition: str  # a key of CONDITIONS
    why: str = ""


@dataclass(frozen=True)
class RewardNeeds:
    """What one reward function reads from a row, and the rollouts whose output it parses."""

    rollouts: tuple[str, ...]  # rollout presets; () = any (it reads only the <answer> every rollout writes)
    data: str  # the data command whose rows carry its fields ({variant}: the reward's `variant` kwarg)
    fields: tuple[FieldNeed, ...]


# (test, how a problem names the field)
CONDITIONS = {
    "set": (lambda value, row: value is not None, "{path}"),
    "non-empty": (lambda value, row: bool(value), "a non-empty {path}"),
    "true/false": (lambda value, row: isinstance(value, bool), "{path} (true/false)"),
    "non-empty if answerable": (
        lambda value, row: field(row, ANSWERABLE) is not True or bool(value),
        "a non-empty {path} on answerable rows",
    ),
}

# What each reward function reads, keyed by the module of its compute_score: the managers eviomni/evinote/grace
# score with verl_evidence.rewards.<name>; a custom function or a composite component names its own. The one place
# these needs are written; docs/reward-managers.md shows them (tests/recipes/test_preflight.py keeps both equal).
REWARD_NEEDS: dict[str, RewardNeeds] = {
    "verl_evidence.rewards.eviomni": RewardNeeds(
        rollouts=("eviomni",),  # o_r and o_e come from the EviOmni loop's extra generations
        data="verl-evidence data eviomni --method {variant}",
        fields=(
            FieldNeed(TARGET, "non-empty", "the answer F1 of o_r, o_e and o_f"),
            FieldNeed("extra_info.passages", "non-empty", "the passages the loop reads and L_P is counted on"),
            FieldNeed("extra_info.eviomni_len_p", "set", "L_P in policy tokens"),
        ),
    ),
    "verl_evidence.rewards.evinote": RewardNeeds(
        rollouts=("search", "tool_agent"),  # the notes (<summary>) of a multi-turn search trajectory
        data="verl-evidence data qa --method evinote",
        fields=(FieldNeed(TARGET, "non-empty", "the exact match and the NLI claim"),),
    ),
    "verl_evidence.rewards.grace": RewardNeeds(
        rollouts=("single_turn",),  # the context is in the prompt
        data="verl-evidence data grace",
        fields=(
            FieldNeed(TARGET, "non-empty", "the answer ROUGE-L"),
            # Search-R1/FlashRAG rows carry `evidence: []` for "not annotated": read as "unanswerable", every
            # refusal would be rewarded
            FieldNeed(ANSWERABLE, "true/false", "which path is right; `evidence: []` alone would mean unanswerable"),
            FieldNeed(EVIDENCE, "non-empty if answerable", "the evidence ROUGE-L"),
        ),
    ),
    "verl_evidence.rewards.answer": RewardNeeds(
        rollouts=(),  # exact match / F1 of the <answer> block, which every rollout writes
        data="verl-evidence data qa --method search_r1",
        fields=(FieldNeed(TARGET, "non-empty", "the gold answers"),),
    ),
}
MANAGER_REWARDS = ("eviomni", "evinote", "grace")  # registered managers scoring with verl_evidence.rewards.<name>


class PreflightError(Exception):
    pass


@dataclass(frozen=True)
class RewardPart:
    """One reward function of the run: ``label`` names it in messages, ``function`` as configured."""

    label: str
    function: str | None  # None: verl's default scoring by data_source
    kwargs: Mapping[str, Any]


def split_argv(argv: list[str]) -> tuple[Path, str, list[str]]:
    config_path = config_name = None
    overrides = []
    for arg in argv:
        if arg.startswith("--config-path="):
            config_path = Path(arg.split("=", 1)[1])
        elif arg.startswith("--config-name="):
            config_name = arg.split("=", 1)[1]
        elif not arg.startswith("--"):
            overrides.append(arg)
    if config_path is None or config_name is None:
        raise PreflightError("the trainer command has no --config-path/--config-name")
    return config_path, config_name, overrides


def compose(config_path: Path, config_name: str, overrides: list[str]):
    """The trainer's config (with Hydra's own node: the preset choices). verl's config directory is found without
    importing verl (seconds of start-up).

    An override Hydra cannot apply (a misspelt key or preset, a bad value) is the user's to fix: one line naming it.
    """
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("hydra") is None:
        raise PreflightError(
            f"verl is not installed for {sys.executable}: run the recipe with PYTHON=<the venv's python>"
        )
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    verl_config = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    overrides = [user_searchpath(override, verl_config) for override in overrides]
    try:
        with initialize_config_dir(config_dir=str(config_path.resolve()), version_base=None):
            return hydra_compose(
                config_name=config_name,
                overrides=[*overrides, f"hydra.searchpath=[file://{verl_config}]"],  # unless the user gave one
                return_hydra_config=True,
            )
    except (HydraException, OmegaConfBaseException) as err:
        what = one_line(str(err))
        if isinstance(err, OverrideParseException):  # its message does not repeat the override
            what = f"cannot parse the override {err.override!r}: {what}"
        raise PreflightError(
            f"the trainer config does not compose with the overrides given: {what} "
            "(a misspelt key, preset or value? `--cfg job` prints the config the recipe composes)"
        ) from err


SEARCHPATH_EXAMPLE = "'hydra.searchpath=[pkg://verl.trainer.config,file:///abs/path/to/my_presets]'"


def user_searchpath(override: str, verl_config: Path) -> str:
    """A ``hydra.searchpath=[...]`` override of the user's (presets kept in a directory of their own), with verl's
    config found without importing verl; refused when it leaves verl's config out.

    Hydra reads the first such override instead of the presets' own ``hydra.searchpath`` (verl's
    ``pkg://verl.trainer.config``, where ``ppo_trainer`` is), so the user's list must name it too.
    """
    if not override.lstrip("+").startswith("hydra.searchpath="):
        return override
    if "pkg://verl.trainer.config" not in override:
        raise PreflightError(
            f"the override {override!r} replaces the presets' search path, which holds verl's trainer config "
            f"(ppo_trainer): keep verl's first, e.g. {SEARCHPATH_EXAMPLE} (docs/reward-managers.md)"
        )
    return override.replace("pkg://verl.trainer.config", f"file://{verl_config}")


def one_line(text: str) -> str:
    """Hydra's multi-line message on one line, without the config search path it appends to a missing preset."""
    parts = [line.strip() for line in text.split("Config search path:")[0].splitlines() if line.strip()]
    joined = parts[:1]
    for part in parts[1:]:
        joined.append((" " if joined[-1].endswith((":", ",", ".")) else ", ") + part)
    return "".join(joined)


def load_yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def preset_dirs(cfg) -> list[Path]:
    """The directories Hydra looked for presets in, in its order (the recipes' presets, then the user's
    ``hydra.searchpath`` directories): the first holding a preset is the one it read."""
    sources = cfg.hydra.runtime.config_sources
    return [Path(source.path) for source in sources if source.schema == "file" and Path(source.path).is_dir()]


def preset_file(cfg, group: str, name: str) -> Path | None:
    """The file Hydra read for ``group=name``."""
    return next((d / group / f"{name}.yaml" for d in preset_dirs(cfg) if (d / group / f"{name}.yaml").is_file()), None)


def rollout_loops(cfg) -> dict[str, str]:
    """Rollout preset name -> the agent loop it selects (read from every preset directory's rollout_preset/*.yaml; the
    first directory holding a name wins, as in Hydra)."""
    loops: dict[str, str] = {}
    for directory in preset_dirs(cfg):
        for path in sorted((directory / "rollout_preset").glob("*.yaml")):
            loop = (load_yaml(path).get("agent") or {}).get("default_agent_loop")
            if loop:
                loops.setdefault(path.stem, loop)
    return loops


# What a reward preset file of one's own looks like (docs/reward-managers.md shows it whole).
PRESET_SHAPE = (
    "`# @package reward` as its first line, then reward_manager:, reward_kwargs: and (for a reward function of your "
    "own) requires: at the top level, with no `reward:` key above them"
)


def preset_shape_problem(cfg, preset: str, path: Path) -> str | None:
    """A reward preset whose keys Hydra did not put under ``reward`` (a top-level ``reward:`` key, or no
    ``# @package reward`` line): the run would score with verl's default reward, not the file's."""
    if cfg.reward.get("reward") is not None:
        where = "reward.reward (a top-level `reward:` key in a file Hydra already reads into reward)"
    elif cfg.get("reward_preset") is not None:
        where = "reward_preset (no `# @package reward` first line)"
    else:
        return None
    return (
        f"reward preset {preset!r} ({path}) is not read as a reward preset: its keys landed under {where}, so the "
        f"run would score with verl's {cfg.reward.reward_manager.name!r} manager instead; write it with {PRESET_SHAPE} "
        "(docs/reward-managers.md, 'A reward preset of your own')"
    )


def plain(value: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def function_module(spec: str) -> str:
    """``pkg://a.b``, ``a.b:fn``, ``pkg://a.b:fn`` -> ``a.b`` (a file path stays as it is)."""
    module = spec.removeprefix("pkg://")
    head, sep, tail = module.rpartition(":")
    return head if sep and head and tail.isidentifier() else module


def reward_parts(cfg) -> list[RewardPart]:
    """The reward functions that score this run, as the managers build them (reward_managers/scorers.py)."""
    manager = cfg.reward.reward_manager.name
    custom_config = cfg.reward.get("custom_reward_function") or {}
    custom = custom_config.get("path")
    kwargs = plain(cfg.reward.get("reward_kwargs")) or {}
    if manager in MANAGER_REWARDS:
        return [RewardPart(f"{manager} reward", f"verl_evidence.rewards.{manager}", kwargs)]
    if manager != "composite":  # verl's managers (naive, dapo, ...) call the custom function, else verl's default
        name = function_module(custom).removeprefix("verl_evidence.rewards.") if custom else "default"
        return [
            RewardPart(f"{name} reward ({manager} manager)", custom, plain(custom_config.get("reward_kwargs")) or {})
        ]
    components = kwargs.get("components")
    if not isinstance(components, list) or not components or not all(isinstance(c, dict) for c in components):
        raise PreflightError(
            "the composite reward manager needs reward.reward_kwargs.components, a list of {reward, weight} "
            "(docs/reward-managers.md)"
        )
    parts = []
    for component in components:
        reward = str(component.get("reward"))
        function = f"verl_evidence.rewards.{reward}" if reward in MANAGER_REWARDS else reward
        if reward == "custom":
            function = custom
        label = f"composite's {component.get('name') or reward} component"
        parts.append(RewardPart(label, function, component.get("kwargs") or {}))
    return parts


def needs_of(part: RewardPart, cfg, preset_file: Path) -> RewardNeeds:
    """The table's needs of the part's function; a function it does not know: the preset's ``requires:`` block."""
    known = REWARD_NEEDS.get(function_module(part.function or ""))
    if known is not None:
        return known
    requires = plain(cfg.reward.get("requires"))
    if requires:
        fields = tuple(FieldNeed(str(name), "set") for name in requires.get("row_fields") or ())
        return RewardNeeds(
            tuple(requires.get("rollout") or ()), str(requires.get("data") or "your data command"), fields
        )
    scored_by = f"function {part.function!r}" if part.function else "verl's default scoring by data_source"
    raise PreflightError(
        f"no reward preset describes the {part.label} ({scored_by}): add a `requires:` block with its rollout, "
        f"data command and row fields to {preset_file} or a preset of your own (docs/reward-managers.md), or "
        "start anyway with PREFLIGHT=0"
    )


def as_paths(value: Any) -> list[str]:
    if value is None or str(value) in ("", "null", "None"):
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def first_rows(path: str) -> list[dict]:
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        raise FileNotFoundError(path)
    parquet = pq.ParquetFile(path)
    if not parquet.metadata.num_rows:
        return []
    return next(parquet.iter_batches(batch_size=ROWS_CHECKED)).to_pylist()


def field(row: dict, dotted: str) -> Any:
    value: Any = row
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def data_files(cfg) -> dict[str, list[str]]:
    """Path -> the config keys naming it (a file given as both train and val files is read once)."""
    files: dict[str, list[str]] = {}
    for key in ("train_files", "val_files"):
        for path in as_paths(cfg.data.get(key)):
            files.setdefault(path, []).append(f"data.{key}")
    return files


# -- prompt lengths -----------------------------------------------------------------------------------------------


def tokenizer_dir(model_path: str) -> Path | None:
    """The policy's tokenizer files on this machine: its directory, or the Hugging Face cache's copy."""
    local = Path(model_path).expanduser()
    if local.is_dir():
        return local if (local / "tokenizer.json").is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model_path, "tokenizer.json")
    except Exception:  # not a hub id either: the trainer reports the path itself
        return None
    return Path(found).parent if isinstance(found, str) else None


class PromptLengths:
    """Prompt token counts as verl's overlong filter takes them: the chat template applied, generation prompt on."""

    def __init__(self, directory: Path, template_kwargs: Mapping[str, Any]) -> None:
        from tokenizers import Tokenizer

        self.directory = directory
        self.template_kwargs = dict(template_kwargs)
        self.messages_only = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._templated = None

    def lower_bounds(self, prompts: list[Any]) -> list[int]:
        """The messages' own tokens: the template only adds to them."""
        contents = [[str(m.get("content") or "") for m in (p or []) if isinstance(m, dict)] for p in prompts]
        flat = self.messages_only.encode_batch([c for cs in contents for c in cs], add_special_tokens=False)
        counts, start = [], 0
        for cs in contents:
            counts.append(sum(len(e.ids) for e in flat[start : start + len(cs)]))
            start += len(cs)
        return counts

    def exact(self, prompt: list[dict]) -> int:
        if self._templated is None:  # transformers only for a refusal
            from transformers import PreTrainedTokenizerFast

            self._templated = PreTrainedTokenizerFast.from_pretrained(str(self.directory))
        ids = self._templated.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=True, **self.template_kwargs
        )
        ids = ids["input_ids"] if isinstance(ids, Mapping) else ids
        return len(ids)


def prompt_batches(path: str, key: str) -> Iterator[list[Any]]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=[key]):
        yield batch.column(0).to_pylist()


def overlong_problem(path: str, keys: list[str], cfg, lengths: PromptLengths) -> str | None:
    """Every prompt of the file longer than data.max_prompt_length: verl's filter would leave no rows.

    A prompt counts as too long when its messages alone are (``tokenizers``, milliseconds): the chat template only
    adds tokens, so no file verl would train on is refused. (Rendering every template needs transformers, whose
    import costs 10+ s on a busy node; the refusal's lengths are rendered, as verl counts them.) Stops at the
    first prompt that may fit, the first row of a file made for this run: only a file about to be refused is
    read to its end.
    """
    limit = int(cfg.data.max_prompt_length)
    shortest = longest = None  # (lower bound, prompt)
    rows = 0
    for prompts in prompt_batches(path, cfg.data.get("prompt_key", "prompt")):
        for prompt, bound in zip(prompts, lengths.lower_bounds(prompts), strict=True):
            rows += 1
            if bound <= limit:
                return None
            shortest = (bound, prompt) if shortest is None or bound < shortest[0] else shortest
            longest = (bound, prompt) if longest is None or bound > longest[0] else longest
    if shortest is None:
        return None
    low, high = lengths.exact(shortest[1]), lengths.exact(longest[1])
    return (
        f"{'/'.join(keys)}: all {rows} prompts of {path} are longer than data.max_prompt_length={limit} tokens "
        f"(shortest {low}, longest {high}), so verl's overlong filter would leave no rows; raise PROMPT_LEN "
        f"(data.max_prompt_length) to at least {low}, or prepare the rows with fewer or shorter passages"
    )


# -- devices --------------------------------------------------------------------------------------------------------


def joined_cluster(cfg) -> str | None:
    """The running Ray cluster the trainer's ray.init will join (RAY_ADDRESS, the config's address, a cluster that
    `ray start` brought up here), or None: it starts a Ray instance of its own."""
    from ray._private import services

    ray_init = plain(cfg.get("ray_kwargs", {}).get("ray_init")) or {}
    try:
        return services.canonicalize_bootstrap_address(ray_init.get("address"), ray_init.get("_temp_dir"))
    except Exception:  # an address Ray cannot use: ray.init says so itself
        return None


def gpu_problem(cfg) -> str | None:
    """verl asks Ray for trainer.nnodes x trainer.n_gpus_per_node GPUs and waits for them: absent ones, forever.

    Not checked when the run joins a running Ray cluster (its GPUs are the cluster's, e.g. a Slurm job's) or tells
    Ray how many GPUs there are (ray_init.num_gpus, as the CPU mode does).
    """
    wanted = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    ray_init = plain(cfg.get("ray_kwargs", {}).get("ray_init")) or {}
    if wanted <= 0 or ray_init.get("num_gpus") is not None:
        return None
    from ray._private.accelerators import get_accelerator_manager_for_resource

    if joined_cluster(cfg):
        return None
    resource = "NPU" if str(cfg.trainer.get("device")) == "npu" else "GPU"  # what verl's resource pool counts
    manager = get_accelerator_manager_for_resource(resource)
    visible = manager.get_current_process_visible_accelerator_ids()
    found = manager.get_current_node_num_accelerators()
    found = min(found, len(visible)) if visible is not None else found
    if found >= wanted:
        return None
    return (
        f"this run asks Ray for {wanted} {resource}(s) (trainer.nnodes={cfg.trainer.nnodes} x "
        f"trainer.n_gpus_per_node={cfg.trainer.n_gpus_per_node}) and this node has {found}, so verl would wait for "
        f"them forever; on a machine without GPUs add --smoke to the recipe (docs/debug-on-cpu.md), else set "
        f"GPUS_PER_NODE/NNODES to what the node or the Ray cluster has"
    )


# verl 0.9.1's trainer always runs the TransferQueue, whose controller is this named actor (transfer_queue/interface.py)
TRANSFER_QUEUE_CONTROLLER = {"name": "TransferQueueController", "namespace": "transfer_queue"}


def running_trainer_problem(address: str) -> str | None:
    """A trainer already running on the cluster at ``address``: a second one would find its TransferQueue controller
    by name, attach to it instead of making its own, and lose it when the first trainer ends (docs/recipes.md)."""
    import socket

    import ray

    def unchecked(why: str) -> None:  # the trainer's own ray.init fails on such a cluster, with Ray's own message
        print(f"# pre-flight: no trainer check on the Ray cluster at {address}: {why}", file=sys.stderr)

    host, _, port = address.rpartition(":")
    try:  # ray.init retries an address nobody listens at for a minute
        socket.create_connection((host, int(port)), timeout=2).close()
    except (OSError, ValueError) as err:
        return unchecked(f"nothing answers there ({err})")
    attach = not ray.is_initialized()  # a process already connected (a test's driver) asks through its connection
    try:
        if attach:
            # A GCS that refuses this process (Ray's token authentication) is retried once a second for 20 s by
            # default (ray/_private/node.py); one that answers does so at once, and the trainer's ray.init says why.
            os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "3")
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        named = ray.util.list_named_actors(all_namespaces=True)
    except Exception as err:  # e.g. Ray's token authentication refusing this process
        causes = [err, *([err.__cause__] if err.__cause__ else [])]  # ray.init's ConnectionError hides the reason
        reasons = "; ".join(f"{type(e).__name__}: {one_line(str(e))}" for e in causes)
        return unchecked(f"cannot connect ({reasons})")
    finally:
        if attach and ray.is_initialized():
            ray.shutdown()
    if TRANSFER_QUEUE_CONTROLLER not in named:
        return None
    return (
        f"the Ray cluster at {address} already runs a verl trainer (its {TRANSFER_QUEUE_CONTROLLER['name']} actor is "
        f"alive): two trainers on one cluster share that controller and the second loses it when the first ends; "
        f"run this one on a cluster of its own (another Slurm job) or after the first ends"
    )


def shared_cluster_problem(cfg) -> str | None:
    """A trainer joining a running cluster (the Slurm job's) where another trainer runs; None on a Ray of its own."""
    address = joined_cluster(cfg)
    return running_trainer_problem(address) if address else None


def overlong_buffer_problem(cfg) -> str | None:
    """verl's DAPO manager penalises tokens past ``max_resp_len - overlong_buffer_cfg.len``: a buffer as long as the
    response budget penalises every response, whatever the reward, and the run would train on the penalty alone."""
    kwargs = cfg.reward.get("reward_kwargs") or {}
    buffer = kwargs.get("overlong_buffer_cfg") or {}
    if not buffer.get("enable"):
        return None
    length, budget = int(buffer.get("len")), kwargs.get("max_resp_len")
    budget = int(cfg.data.max_response_length if budget is None else budget)
    if length < budget:
        return None
    return (
        f"reward.reward_kwargs.overlong_buffer_cfg.len={length} is not below the response budget max_resp_len="
        f"{budget} (data.max_response_length), so DAPO's overlong penalty would start at {budget - length} tokens and "
        f"hit every response; raise RESPONSE_LEN (data.max_response_length) or lower OVERLONG_LEN"
    )


# -- the check ------------------------------------------------------------------------------------------------------


def data_command(part: RewardPart, need: RewardNeeds) -> str:
    return need.data.format(variant=part.kwargs.get("variant", "eviomni"))


def rollout_fit(
    needs: list[tuple[RewardPart, RewardNeeds]], loops: dict[str, str], default_loop: str
) -> tuple[dict[str, str], list[str]]:
    """The agent loops every part of the reward can score (loop -> rollout preset), and the problems found."""
    bound = [(part, need) for part, need in needs if need.rollouts]
    allowed = set(loops) if not bound else set.intersection(*(set(need.rollouts) for _, need in bound))
    if not allowed:
        parsed = ", ".join(f"the {part.label} parses rollout {' or '.join(need.rollouts)}" for part, need in bound)
        return {}, [f"no rollout serves every part of this reward ({parsed}): pick components that read one"]
    allowed_loops = {loops[name]: name for name in sorted(allowed) if name in loops}
    if default_loop in allowed_loops:
        return allowed_loops, []
    hint = " or ".join(f"rollout_preset={name}" for name in sorted(allowed))
    return allowed_loops, [f"the rollout runs agent loop {default_loop!r}; use {hint}"]


def row_problems(
    where: str,
    path: str,
    rows: list[dict],
    needs: list[tuple[RewardPart, RewardNeeds]],
    allowed_loops: dict[str, str],
    default_loop: str,
) -> list[str]:
    """Fields a part reads that these rows lack (or hold unusable values of), and agent loops they name."""
    problems, seen = [], set()
    for part, need in needs:
        for need_field in need.fields:
            test, shown = CONDITIONS[need_field.condition]
            if need_field.path in seen or all(test(field(row, need_field.path), row) for row in rows):
                continue
            seen.add(need_field.path)
            why = f" ({need_field.why})" if need_field.why else " (rows for another method?)"
            problems.append(
                f"{where}: rows of {path} lack {shown.format(path=need_field.path)}, which the {part.label} "
                f"reads{why}; prepare rows with `{data_command(part, need)}`"
            )
    row_loops = sorted({row.get("agent_name") or default_loop for row in rows} - set(allowed_loops))
    if allowed_loops and row_loops and row_loops != [default_loop]:
        problems.append(
            f"{where}: rows of {path} name agent loop {', '.join(map(repr, row_loops))} in their agent_name "
            f"column, which wins over the rollout preset; prepare rows with `{data_command(*needs[0])}`"
        )
    return problems


def prompt_lengths(cfg) -> PromptLengths | None:
    """The policy's prompt counter, when verl filters overlong prompts: its own tokenizer when on this machine, else
    for a Qwen2.5/Qwen3 policy Qwen's vocabulary built offline (the same ids; said on stderr)."""
    if not cfg.data.get("filter_overlong_prompts"):
        return None
    model = str(cfg.actor_rollout_ref.model.path)
    found = tokenizer_dir(model)
    if found is None:
        from verl_evidence.local.qwen_tokenizer import describe_stand_in, qwen_family, qwen_tokenizer_dir

        family = qwen_family(model)
        if family is None:  # not a refusal: the trainer loads (downloads) the model and its tokenizer itself
            print(f"# pre-flight: prompt lengths not checked: no tokenizer.json of {model} here yet", file=sys.stderr)
            return None
        print(f"# pre-flight: prompt {describe_stand_in(family, model)}", file=sys.stderr)
        found = qwen_tokenizer_dir(family)
    return PromptLengths(found, plain(cfg.data.get("apply_chat_template_kwargs")) or {})


def check(argv: list[str]) -> list[str]:
    """Problems with this trainer command, one line each (empty: reward, rollout, data and devices fit)."""
    config_path, config_name, overrides = split_argv(argv)
    cfg = compose(config_path, config_name, overrides)
    chosen = cfg.hydra.runtime.choices.get("reward_preset")
    preset = chosen or config_name
    found = preset_file(cfg, "reward_preset", chosen) if chosen else config_path / f"{config_name}.yaml"
    path = found or config_path / "reward_preset" / f"{preset}.yaml"
    shape = preset_shape_problem(cfg, preset, path)
    if shape:
        raise PreflightError(shape)
    needs = [(part, needs_of(part, cfg, path)) for part in reward_parts(cfg)]
    default_loop = cfg.actor_rollout_ref.rollout.agent.default_agent_loop
    allowed_loops, reward_problems = rollout_fit(needs, rollout_loops(cfg), default_loop)
    problems = [p for p in [gpu_problem(cfg), shared_cluster_problem(cfg), overlong_buffer_problem(cfg)] if p]
    lengths = prompt_lengths(cfg)
    for path, keys in data_files(cfg).items():
        where = "/".join(keys)
        try:
            rows = first_rows(path)
        except FileNotFoundError:
            reward_problems.append(f"{where}: {path} does not exist; prepare rows with `{data_command(*needs[0])}`")
            continue
        except (OSError, ValueError) as err:  # not parquet (pyarrow's errors are these): the user's to fix
            reward_problems.append(f"{where}: cannot read {path} as parquet ({type(err).__name__}: {err})")
            continue
        if not rows:
            reward_problems.append(f"{where}: {path} has no rows; prepare rows with `{data_command(*needs[0])}`")
            continue
        reward_problems += row_problems(where, path, rows, needs, allowed_loops, default_loop)
        overlong = overlong_problem(path, keys, cfg, lengths) if lengths else None
        problems += [overlong] if overlong else []
    return problems + [f"reward preset {preset!r}: {problem}" for problem in reward_problems]


def main() -> None:
    try:
        problems = check(sys.argv[1:])
    except PreflightError as err:  # the run cannot be checked at all: one line, no traceback
        print(f"error: {err}; nothing was started", file=sys.stderr)
        sys.exit(2)
    if problems:
        for problem in problems:
            print(f"error: {problem}; nothing was started", file=sys.stderr)
        sys.exit(2)
    print("# pre-flight: reward, rollout, data and devices fit", file=sys.stderr)


if __name__ == "__main__":
    main()
