"""The order of the tests and their pytest-xdist scheduling units, from marks on the tests (a pytest plugin).

Under pytest-xdist (`make test`: -n 2) the suite keeps both cores busy, so what costs CPU is shared between the
workers and the order decides how the run ends: the longest tests start first, so that no worker ends the run alone with
one, and the shared EviOmni training (`eviomni_smoke_run`) starts early in the test that needs it most.
Both workers share one Ray/Serve session cluster (`retrieval_server`): the first to need it starts it.
A test's place is a mark on the test itself (registered in pyproject.toml), so that it moves with a renamed test:
- `longest_first(rank)`: starts before the unmarked tests, rank 0 first (longest first, as `make test --durations`
  measured them); the others follow in collection order.
- `run_last`: a reader of what a long test leaves, so that it finds it done instead of waiting for it on another
  worker.
- `mostly_waits`: a test that sleeps or polls far more than it computes (fake job steps, retry and deadline waits):
  it starts among the long tests, after rank :data:`MOSTLY_WAITS_AFTER_RANK`, so that its waits overlap a smoke
  training rather than another such test's waits at the end of the run (the timeline below showed both cores ~50 %
  idle there, running such tests side by side).
- `one_worker_group(name)`: tests that share a costly module-scoped fixture (an NLI actor, a 2 GiB store, adopted
  and converted indexes, Serve apps of their own) run on one worker, so that the fixture is built once; without a
  name (a module's `pytestmark`), the whole module. A module that deploys a named Serve app on the shared session
  cluster must be one group: on two workers it would be deployed twice under one name, each deployment replacing
  the other's. Every other test is scheduled on its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

SCHEDULE_MARKS = ("longest_first", "run_last", "one_worker_group", "mostly_waits")
# The `mostly_waits` tests are queued after the longest_first tests of ranks up to this one. pytest-xdist keeps two
# units queued per worker, so they start early, on the worker whose first long test ends first (the judge tests'),
# beside the shared EviOmni run's start-up. Measured: the whole run 11:49 with 1 here, 11:40 with 2 (within this
# machine's ~20 s noise), against 12:44 with these tests at the end (a helper's light analysis ran beside that run).
MOSTLY_WAITS_AFTER_RANK = 2
_SCOPES_FILE = pytest.StashKey[Path]()
_SCOPES_INPUT = "verl_evidence_one_worker_scopes"  # key of pytest-xdist's workerinput: where workers leave the groups


def start_rank(item: pytest.Item) -> tuple[int, int, int]:
    """Sort key: the `longest_first` tests by rank (the `mostly_waits` ones after rank MOSTLY_WAITS_AFTER_RANK), then
    the unmarked ones, then the `run_last` ones."""
    if (mark := item.get_closest_marker("longest_first")) is not None:
        return (0, mark.args[0], 0)
    if item.get_closest_marker("mostly_waits") is not None:
        return (0, MOSTLY_WAITS_AFTER_RANK, 1)
    return (2, 0, 0) if item.get_closest_marker("run_last") is not None else (1, 0, 0)


def one_worker_scope(item: pytest.Item) -> str:
    """The scheduling unit of a test: its `one_worker_group` (a module's when unnamed), or the test itself."""
    mark = item.get_closest_marker("one_worker_group")
    if mark is None:
        return item.nodeid
    return f"one worker: {mark.args[0] if mark.args else item.nodeid.split('::', 1)[0]}"


def check_schedule_marks(items: list[pytest.Item]) -> None:
    """Stop on a malformed scheduling mark, or a rank or group name used in two modules (a copied mark), naming the
    tests; a misspelt mark's name is refused by pytest itself (`strict_markers` in pyproject.toml)."""
    wrong, modules = [], {}
    for item in items:
        first, last, group, waits = (item.get_closest_marker(name) for name in SCHEDULE_MARKS)
        module = item.nodeid.split("::", 1)[0]
        if first and (first.kwargs or len(first.args) != 1 or type(first.args[0]) is not int or first.args[0] < 0):
            wrong.append(f"{item.nodeid}: longest_first takes one rank, an int >= 0")
        elif first:
            modules.setdefault(("longest_first rank", first.args[0]), set()).add(module)
        if last and (first or last.args or last.kwargs):
            wrong.append(f"{item.nodeid}: run_last takes no arguments and excludes longest_first")
        if waits and (first or last or waits.args or waits.kwargs):
            wrong.append(f"{item.nodeid}: mostly_waits takes no arguments and excludes longest_first and run_last")
        if group and (group.kwargs or len(group.args) > 1 or not all(isinstance(a, str) and a for a in group.args)):
            wrong.append(f"{item.nodeid}: one_worker_group takes at most a group name")
        elif group and group.args:
            modules.setdefault(("one_worker_group", group.args[0]), set()).add(module)
    wrong += [f"{kind} {value!r} is used in {sorted(used)}" for (kind, value), used in modules.items() if len(used) > 1]
    if wrong:
        raise pytest.UsageError("scheduling marks (see tests/scheduling.py): " + "; ".join(wrong))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's `load` distribution, one test at a time in collection order, with each `one_worker_group` kept
    whole. xdist's own `loadgroup` marks do not reach its scheduler under pytest 9.2 (their node-id rewrite is lost),
    and this controller process collects nothing, so the workers leave each test's group in a file for it."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # xdist would put the units with most tests first: keep our order
    scopes_file = _scopes_file(config)

    class LongestFirstScheduling(LoadScopeScheduling):
        scopes: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.scopes is None:  # first called once every worker has reported its collection: the file is written
                self.scopes = json.loads(scopes_file.read_text())
            return self.scopes.get(nodeid, nodeid)

    return LongestFirstScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(pytest-xdist controller, before the scheduler is made) Tell each worker where to leave its tests' groups."""
    if node.config.getvalue("dist") == "load":
        node.workerinput[_SCOPES_INPUT] = str(_scopes_file(node.config))


def _scopes_file(config: pytest.Config) -> Path:
    """(pytest-xdist controller) This run's file of {node id: scheduling unit}, written by the workers."""
    if _SCOPES_FILE not in config.stash:
        import shutil
        import tempfile

        directory = Path(tempfile.mkdtemp(prefix="verl-evidence-schedule-"))
        config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
        config.stash[_SCOPES_FILE] = directory / "one-worker-scopes.json"
    return config.stash[_SCOPES_FILE]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Check the scheduling marks; the longest tests first (stable: every worker collects the same order, as
    pytest-xdist requires); on a pytest-xdist worker, leave the tests' groups for the scheduler."""
    check_schedule_marks(items)
    items.sort(key=start_rank)
    scopes_file = getattr(config, "workerinput", {}).get(_SCOPES_INPUT)
    if scopes_file:  # both workers write the same content; each replaces the file whole
        scopes = {item.nodeid: scope for item in items if (scope := one_worker_scope(item)) != item.nodeid}
        partial = Path(f"{scopes_file}.{config.workerinput['workerid']}")
        partial.write_text(json.dumps(scopes))
        os.replace(partial, scopes_file)


# `VERL_EVIDENCE_TEST_TIMELINE=<file>`: each test's start, end (wall clock) and CPU seconds per worker, one JSON line
# per test, to read beside a CPU sampler when tuning the order: where both workers wait (a lock, a sleep) the cores
# idle.
_TIMELINE = os.environ.get("VERL_EVIDENCE_TEST_TIMELINE")


if _TIMELINE:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem):
        import resource
        import time

        def cpu_s() -> float:  # this worker's CPU and that of the subprocesses it waited for (not Ray's daemons)
            own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime

        start, cpu_start = time.time(), cpu_s()
        yield
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(_TIMELINE, "a", encoding="utf-8") as timeline:  # one short append per test: lines never interleave
            record = {"worker": worker, "test": item.nodeid, "start": start, "end": time.time(),
                      "cpu_s": round(cpu_s() - cpu_start, 2)}  # fmt: skip
            timeline.write(json.dumps(record) + "\n")
