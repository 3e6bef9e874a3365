"""verl_evidence.worker_setup: Ray's worker set-up hook that every recipe passes (garbage-collector thresholds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from recipe_commands import dry_run, overrides, trainer_argv

from verl_evidence import worker_setup
from verl_evidence.worker_setup import DEFAULT_GC_THRESHOLD, GC_THRESHOLD_ENV, gc_threshold

HOOK = "verl_evidence.worker_setup.setup_worker"
HOOK_KEY = "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"
ENV_KEY = f"ray_kwargs.ray_init.runtime_env.env_vars.{GC_THRESHOLD_ENV}"


def test_the_thresholds_come_from_the_variable_or_the_default() -> None:
    assert gc_threshold(None) == gc_threshold("") == gc_threshold("  ") == DEFAULT_GC_THRESHOLD
    assert DEFAULT_GC_THRESHOLD != (700, 10, 10)  # Python's: the hook would change nothing
    assert gc_threshold("50000,20,20") == (50000, 20, 20)
    assert gc_threshold(" 2000 ") == (2000,)
    assert gc_threshold("python") is None and gc_threshold("Python") is None


@pytest.mark.parametrize("value", ["fast", "1,2,3,4", "-5", "1,,2", "100000;100"])
def test_a_threshold_that_is_not_one_names_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=GC_THRESHOLD_ENV) as error:
        gc_threshold(value)
    assert "'python'" in str(error.value)


def setup_in_a_fresh_interpreter(**env: str) -> subprocess.CompletedProcess:
    probe = f"import gc, json; gc.set_threshold(700, 10, 10); import {worker_setup.__name__} as w; w.setup_worker(); "
    probe += "print(json.dumps(gc.get_threshold()))"
    base = {key: value for key, value in os.environ.items() if key != GC_THRESHOLD_ENV}
    return subprocess.run([sys.executable, "-c", probe], env={**base, **env}, capture_output=True, text=True)


def test_the_hook_sets_the_thresholds_and_imports_nothing_heavy() -> None:
    assert json.loads(setup_in_a_fresh_interpreter().stdout) == list(DEFAULT_GC_THRESHOLD)
    assert json.loads(setup_in_a_fresh_interpreter(**{GC_THRESHOLD_ENV: "5000,5,5"}).stdout) == [5000, 5, 5]
    assert json.loads(setup_in_a_fresh_interpreter(**{GC_THRESHOLD_ENV: "python"}).stdout) == [700, 10, 10]
    bad = setup_in_a_fresh_interpreter(**{GC_THRESHOLD_ENV: "fast"})
    assert bad.returncode != 0 and f"{GC_THRESHOLD_ENV}='fast'" in bad.stderr  # a worker that cannot start says why
    # it runs before the worker's first import of verl: importing it must not import verl, torch or Ray
    probe = f"import sys, {worker_setup.__name__}; "
    probe += "print(sorted(m for m in ('verl', 'torch', 'ray') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"


@pytest.mark.parametrize("script", ["eviomni_grpo.sh", "evinote_grpo.sh", "grace_dapo.sh", "search_r1_baseline.sh"])
def test_every_trainer_recipe_passes_the_hook_and_can_drop_it(script: str) -> None:
    values = overrides(trainer_argv(dry_run(script, ALLOW_DEMO_CORPUS="1").stdout))
    assert values[HOOK_KEY] == HOOK and ENV_KEY not in values
    dropped = overrides(trainer_argv(dry_run(script, ALLOW_DEMO_CORPUS="1", WORKER_SETUP_HOOK="").stdout))
    assert HOOK_KEY not in dropped
    # the user's thresholds travel in Ray's runtime environment (a joined cluster's workers lack our environment),
    # quoted: Hydra would read 50000,50,50 as a list
    chosen = overrides(trainer_argv(dry_run(script, ALLOW_DEMO_CORPUS="1", **{GC_THRESHOLD_ENV: "50000,50,50"}).stdout))
    assert chosen[ENV_KEY] == "'50000,50,50'" and chosen[HOOK_KEY] == HOOK


# A driver joining the session's cluster with the hook in its job's runtime environment, as verl's main_ppo passes
# the recipes' ray_kwargs.ray_init.runtime_env to ray.init: what its task and actor workers report.
JOINING_DRIVER = """
import gc, json, sys, ray
runtime_env = {"worker_process_setup_hook": sys.argv[2]}
if sys.argv[3]:
    runtime_env["env_vars"] = json.loads(sys.argv[3])
ray.init(address=sys.argv[1], runtime_env=runtime_env, namespace="worker-setup-test", log_to_driver=False)
@ray.remote(num_cpus=0)
def task():
    return gc.get_threshold()
@ray.remote(num_cpus=0)
class Actor:
    def threshold(self):
        return gc.get_threshold()
actor = Actor.remote()
seen = {"task": ray.get(task.remote(), timeout=120), "actor": ray.get(actor.threshold.remote(), timeout=120)}
print(json.dumps(seen))
"""


@pytest.mark.slow  # the session's Ray cluster, a driver and its worker processes
def test_rays_workers_start_through_the_hook(ray_cluster) -> None:
    import ray

    address = ray.get_runtime_context().gcs_address

    def thresholds(env_vars: str = "") -> dict:
        run = subprocess.run(
            [sys.executable, "-c", JOINING_DRIVER, address, HOOK, env_vars],
            capture_output=True,
            text=True,
            timeout=300,
            # the session's cluster is on loopback only: Ray must not swap 127.0.0.1 for the machine's address
            env={key: value for key, value in os.environ.items() if key != GC_THRESHOLD_ENV}
            | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        )
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])

    # one driver (a join costs seconds): thresholds only the hook, reading Ray's runtime env, could have set
    assert thresholds(json.dumps({GC_THRESHOLD_ENV: "3000,3,3"})) == {"task": [3000, 3, 3], "actor": [3000, 3, 3]}
