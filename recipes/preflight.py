"""Pre-flight check every RL recipe runs before its trainer: reward, rollout and data must fit.

    python recipes/preflight.py --config-path=... --config-name=... key=value ...   # the trainer's own arguments

Composes the trainer's config with Hydra exactly as ``verl.trainer.main_ppo`` will, finds what its reward
needs in the ``requires:`` block of the reward preset (recipes/presets/reward_preset/*.yaml) and checks it
against the rollout (the agent loop each row will run) and the first rows of every train/val parquet file.
A mismatch exits 2 before anything starts, naming the data command and the rollout preset to use. A reward
no preset describes fails too: a run this check cannot vouch for is started only on request (PREFLIGHT=0).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROWS_CHECKED = 64  # the first rows of each file: enough to catch rows prepared for another method, read in ms


class PreflightError(Exception):
    pass


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
    """The trainer's config. verl's own config directory is found without importing verl (seconds of start-up).

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
    try:
        with initialize_config_dir(config_dir=str(config_path.resolve()), version_base=None):
            return hydra_compose(
                config_name=config_name, overrides=[*overrides, f"hydra.searchpath=[file://{verl_config}]"]
            )
    except (HydraException, OmegaConfBaseException) as err:
        what = one_line(str(err))
        if isinstance(err, OverrideParseException):  # its message does not repeat the override
            what = f"cannot parse the override {err.override!r}: {what}"
        raise PreflightError(
            f"the trainer config does not compose with the overrides given: {what} "
            "(a misspelt key, preset or value? `--cfg job` prints the config the recipe composes)"
        ) from err


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


def preset_requirements(config_path: Path) -> list[dict]:
    """Every reward preset's ``requires:`` block with the manager and function that identify it."""
    presets = []
    for path in sorted((config_path / "reward_preset").glob("*.yaml")):
        preset = load_yaml(path)
        if "requires" not in preset:
            continue
        presets.append(
            {
                "name": path.stem,
                "manager": preset.get("reward_manager", {}).get("name"),
                "function": (preset.get("custom_reward_function") or {}).get("path"),
                **preset["requires"],
            }
        )
    return presets


def rollout_loops(config_path: Path) -> dict[str, str]:
    """Rollout preset name -> the agent loop it selects (read from recipes/presets/rollout_preset/*.yaml)."""
    return {
        path.stem: load_yaml(path)["agent"]["default_agent_loop"]
        for path in sorted((config_path / "rollout_preset").glob("*.yaml"))
    }


def requirement_for(cfg, config_path: Path) -> dict:
    manager = cfg.reward.reward_manager.name
    function = cfg.reward.get("custom_reward_function", {}).get("path")
    candidates = [p for p in preset_requirements(config_path) if (p["manager"], p["function"]) == (manager, function)]
    chosen = (cfg.reward.get("requires") or {}).get("name")
    for preset in candidates:  # the composed preset's own block first (eviomni and lear share a manager)
        if preset["name"] == chosen:
            return preset
    if candidates:
        return candidates[0]
    raise PreflightError(
        f"no reward preset in {config_path / 'reward_preset'} describes reward manager {manager!r}"
        + (f" with function {function!r}" if function else "")
        + ": add a `requires:` block to its preset (see docs/recipes.md), or start anyway with PREFLIGHT=0"
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


def check(argv: list[str]) -> list[str]:
    """Problems with this trainer command (empty: the reward, rollout and data fit)."""
    config_path, config_name, overrides = split_argv(argv)
    cfg = compose(config_path, config_name, overrides)
    need = requirement_for(cfg, config_path)
    loops = rollout_loops(config_path)
    allowed_loops = {loops[name]: name for name in need["rollout"]}
    rollout_hint = " or ".join(f"rollout_preset={name}" for name in need["rollout"])
    data_hint = f"prepare rows with `{need['data']}`"
    default_loop = cfg.actor_rollout_ref.rollout.agent.default_agent_loop
    problems = []
    if default_loop not in allowed_loops:
        problems.append(f"the rollout runs agent loop {default_loop!r}; use {rollout_hint}")
    files = [("data.train_files", p) for p in as_paths(cfg.data.train_files)]
    files += [("data.val_files", p) for p in as_paths(cfg.data.get("val_files"))]
    for key, path in files:
        try:
            rows = first_rows(path)
        except FileNotFoundError:
            problems.append(f"{key}: {path} does not exist; {data_hint}")
            continue
        except (OSError, ValueError) as err:  # not parquet (pyarrow's errors are these): the user's to fix
            problems.append(f"{key}: cannot read {path} as parquet ({type(err).__name__}: {err}); {data_hint}")
            continue
        if not rows:
            problems.append(f"{key}: {path} has no rows; {data_hint}")
            continue
        missing = [name for name in need["row_fields"] if any(field(row, name) is None for row in rows)]
        if missing:
            problems.append(f"{key}: rows of {path} lack {', '.join(missing)} (rows for another method?); {data_hint}")
        row_loops = sorted({row.get("agent_name") or default_loop for row in rows} - set(allowed_loops))
        if row_loops and row_loops != [default_loop]:
            problems.append(
                f"{key}: rows of {path} name agent loop {', '.join(map(repr, row_loops))} in their agent_name "
                f"column, which wins over the rollout preset; {data_hint}"
            )
    return [f"reward preset {need['name']!r}: {problem}" for problem in problems]


def main() -> None:
    try:
        problems = check(sys.argv[1:])
    except PreflightError as err:  # the run cannot be checked at all: one line, no traceback
        print(f"error: {err}; nothing was started", file=sys.stderr)
        sys.exit(2)
    if problems:
        print("error: the reward, rollout and data of this run do not fit; nothing was started:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        sys.exit(2)
    print("# pre-flight: reward, rollout and data fit", file=sys.stderr)


if __name__ == "__main__":
    main()
