"""recipes/slurm/train.sbatch run for real on two Ray nodes of this machine, cancelled, then requeued.

Only Slurm stands in: `srun` (a step on this machine, with its node's own temporary directory; tests/recipes/
test_slurm.py's SRUN) and `hostname --ip-address` (127.0.0.1). Everything else is what the job runs on a cluster: its
default SETUP (the venv's activate), a real `ray start --head` and `ray start --address` (two Ray nodes, one per
"node"), its readiness probe, `verl-evidence serve --address auto` placed on the head by its Ray resource, and
EviNote's recipe's `--smoke` training attached to that cluster, searching that server, its NLI judge a Ray actor there.

0. A short run first: the server node's replica asks for 16 CPUs where srun gave its step 8; the job ends with
   Serve's own reason and the setting to change, not after RETRIEVAL_START_TIMEOUT.
1. The job (README's `sbatch recipes/slurm/train.sbatch --smoke`) trains step 1 and writes its checkpoint; during
   step 2 it is cancelled as `scancel` and preemption do it
   (SIGTERM to every process of the job, the steps included): every process stops within the grace Slurm gives
   before SIGKILL, and no node keeps Ray's address file (a later plain `ray.init()` there would join a dead cluster).
2. Requeued (the same job id and checkpoint directory; `--requeue`), it resumes from that checkpoint: verl loads
   global_step_1 and reports step 2 first. This run is also the RETRIEVAL_NODE variant (one training for both):
   two nodes, the server on the last one, on a Ray instance of its own outside the training cluster (the first, the
   whole training cluster: run 1 has tested a cluster of two Ray nodes; a third would only cost a Ray start).

Each run's .out is under 200 lines, every one the job's own, its last one saying how the job ended.

3. The two runs together are EviNote's smoke run (steps 1 and 2, the recipe's smoke batch), checked as
   tests/recipes/test_smoke_training.py::check_evinote_run checks a run: rewards that differ within a group, every
   reward component logged as the mean of the dumped samples, no retrieved token trained. One training for both: a
   trainer start is ~50 CPU-s of the suite's bounded time. verl's file logger starts its file anew in each run, so
   the first run's is kept before the requeue.

Ray's token authentication: both runs start with a `~/.ray/auth_token` in the job's HOME (what any local ray.init()
leaves), which made `ray start --head` turn authentication on by itself and refuse every other step; the job now sets
it for all of them, with the user's RAY_AUTH_TOKEN (run 1) or a token of its own (run 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from smoke_runs import SmokeRun, smoke_paths

from retrieval_server.config import cache_dir
from verl_evidence.local.smoke.logs import read_metrics

from .test_slurm import SBATCH, SRUN
from .test_smoke_training import check_evinote_run

# longest_first: the job trains EviNote, is cancelled, is requeued and resumes (the suite's longest test)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.longest_first(2)]

STEP_LINE = re.compile(r"\bstep:(\d+) - ")
HOSTNAME = """#!/usr/bin/env bash
# hostname stand-in: every node of the job is this machine, reached at 127.0.0.1
case "${1:-}" in -i|--ip-address) echo 127.0.0.1 ;; *) exec /usr/bin/env -S hostname "$@" ;; esac
"""
MARK = "VERL_EVIDENCE_TEST_JOB"  # in every process of the job (Slurm knows its processes by cgroup)
GRACE_S = 90  # what the job gets between SIGTERM and the SIGKILL that would follow (Slurm's KillWait is 30 s)
# What a driver sees of the cluster: its live nodes' resources, and the server resource left on each.
CLUSTER_PROBE = """
import json, ray
ray.init(log_to_driver=False)
from ray._private.state import available_resources_per_node
nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
left = available_resources_per_node()
print(json.dumps([{**nodes[i], "left": left.get(i, {}).get("retrieval_host")} for i in nodes]))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_processes(mark: str) -> list[int]:
    """Live processes carrying the job's mark in their environment (inherited by every step, Ray worker, replica)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if needle in proc.joinpath("environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except (OSError, IndexError):
            continue
    return found


def scancel(mark: str) -> list[int]:
    """SIGTERM to every process of the job, as scancel and preemption send it; what outlives GRACE_S is killed and
    returned."""
    for pid in job_processes(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return wait_until_gone(mark)


def wait_until_gone(mark: str) -> list[int]:
    deadline = time.monotonic() + GRACE_S
    while job_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = job_processes(mark)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def checkpoint_files(step_dir: Path) -> set[str]:
    return {str(path.relative_to(step_dir)) for path in step_dir.rglob("*") if path.is_file()}


def address_files(nodes: Path) -> list[Path]:
    return sorted(nodes.glob("*/ray/ray_current_cluster"))


def dumped(dump: Path, step: int) -> list[dict]:
    path = dump / f"{step}.jsonl"
    assert path.is_file(), f"no rollout dump for step {step}"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class SlurmJob:
    """The job's environment as Slurm would give it, and its stand-ins; start() submits (or requeues) it."""

    def __init__(self, tmp_path: Path, index_dir: Path, nodes: Path) -> None:
        self.tmp_path, self.nodes = tmp_path, nodes
        self.bin, self.home = tmp_path / "bin", tmp_path / "home"
        self.run_dir = tmp_path / "run"
        _, self.dump, _ = smoke_paths(self.run_dir)
        # where the job's --smoke keeps its checkpoints (under the submit directory) and verl's metrics file
        self.checkpoints = tmp_path / "checkpoints" / "verl-evidence" / "smoke-evinote_grpo"
        self.metrics_file = self.checkpoints / "metrics.jsonl"
        self.first_run_metrics = self.run_dir / "metrics-run1.jsonl"
        self.logs = tmp_path / "logs"
        for directory in (self.bin, self.home / ".ray", self.run_dir, *(nodes / f"node{n}" for n in (1, 2, 3))):
            directory.mkdir(parents=True, exist_ok=True)
        # left by an earlier local ray.init() of the user's: Ray's `ray start --head` used to turn auth on for it
        self.users_ray_token = uuid.uuid4().hex
        (self.home / ".ray" / "auth_token").write_text(self.users_ray_token)
        for name, text in {"srun": SRUN, "hostname": HOSTNAME}.items():
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        # the caches this test session uses, fixed before the job's HOME moves (smoke_dir()'s default is the cache's
        # smoke/: under CI's fresh VERL_EVIDENCE_CACHE the job builds and reuses what the rest of the suite does)
        cache = cache_dir()
        smoke_dir = os.environ.get("VERL_EVIDENCE_SMOKE_DIR") or str(cache / "smoke")
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RAY_ADDRESS", "RAY_AUTH", "RAY_TMPDIR", "RETRIEVAL_", "VERL_EVIDENCE_RETRIEVAL"))
        }
        self.env = {
            **base,
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(self.home),  # never the user's ~/.ray
            "VERL_EVIDENCE_SMOKE_DIR": smoke_dir,  # the tiny policy and data, prepared once per machine
            "VERL_EVIDENCE_CACHE": str(cache),
            "TMPDIR": str(nodes / "node1"),  # the batch script runs on the first node
            "SRUN_NODES": str(nodes),
            "SRUN_LOG": str(tmp_path / "srun.log"),
            "SLURM_JOB_ID": "4242",
            "NODES": "node1 node2",  # SLURM_JOB_NODELIST through `scontrol show hostnames`
            "SLURM_CPUS_PER_TASK": "8",  # sbatch --cpus-per-task, read by the job script
            "SLURM_GPUS_PER_NODE": "8",  # the #SBATCH line's GPUs, which --smoke does not ask Ray to advertise
            "PYTHONUNBUFFERED": "1",
            "RECIPE": "evinote_grpo.sh",
            "SERVER_ARGS": f"--index-dir {index_dir}",
            "RETRIEVAL_HOST": "127.0.0.1",
            "RETRIEVAL_CPUS": "1",
            "RETRIEVAL_PORT": str(free_port()),
            "HEAD_START_S": "2",
            "CHECK_INTERVAL": "2",  # each Ray probe is a Python start: ~2 CPU-s
            # Ray's dashboard and usage reports: nothing of the job uses them, and on 2 cores they cost CPU
            "RAY_HEAD_ARGS": "--include-dashboard=false",
            "RAY_START_ARGS": "--disable-usage-stats",
            "LOG_DIR": str(self.logs),
            # no GPUS_PER_NODE, SAVE_FREQ, RESUME_MODE, CHECKPOINT_DIR, trainer.nnodes: the job's --smoke sizes itself
            # for CPU nodes, saves every step and resumes (recipes/slurm/README.md); the recipe's smoke batch (two
            # groups) makes it EviNote's smoke run too, whose gated reward must differ within a group
        }

    def both_runs(self) -> SmokeRun:
        """The two runs as one smoke run: step 1's metrics from the first, step 2's from the requeued one."""
        both = self.run_dir / "metrics-both-runs.jsonl"
        both.write_text(self.first_run_metrics.read_text() + self.metrics_file.read_text())
        output = "".join((self.tmp_path / f"trainer-run{n}.log").read_text() for n in (1, 2))
        return SmokeRun(0, output, both, self.dump, self.checkpoints)

    def start(self, output: Path, **env: str) -> tuple[subprocess.Popen, str]:
        mark = uuid.uuid4().hex
        with output.open("w") as out:
            job = subprocess.Popen(
                # recipes/slurm/README.md's command (`bash` for `sbatch`; the stand-ins give Slurm's environment), and
                # where to dump the rollouts the checks read
                ["bash", str(SBATCH), *documented_smoke_args(), f"trainer.rollout_data_dir={self.dump}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.env, "RAY_PORT": str(free_port()), MARK: mark, **env},
                cwd=self.tmp_path,  # SLURM_SUBMIT_DIR; REPO is found from the script's path
                start_new_session=True,
            )
        return job, mark


def documented_smoke_args() -> list[str]:
    """The arguments of the job's smoke command as recipes/slurm/README.md shows it (`sbatch ... --smoke`)."""
    readme = (SBATCH.parent / "README.md").read_text()
    found = re.search(r"^sbatch recipes/slurm/train\.sbatch (--smoke)\s*(#.*)?$", readme, re.M)
    assert found, "recipes/slurm/README.md no longer shows `sbatch recipes/slurm/train.sbatch --smoke`"
    return [found[1]]


OWN_LINE = re.compile(r"\[\d\d:\d\d:\d\d\] [a-z]+: ")


def check_the_out_reads(text: str, last: str, logs: Path) -> None:
    """The .out a person reads: under 200 lines, each the job's own (`[HH:MM:SS] stage: ...`) or a command it runs
    (`+ ...`), no trainer config or warnings, ending with how the job ended; verl's resolved config in its file."""
    lines = text.splitlines()
    assert len(lines) < 200, f"{len(lines)} lines in the .out:\n{text[-4000:]}"
    assert all(OWN_LINE.match(line) or line.startswith("+ ") for line in lines), text[-4000:]
    assert "actor_rollout_ref" not in text and "target_num_threads" not in text
    config = yaml.safe_load((logs / "trainer-config.yaml").read_text())
    assert f"its resolved config: {logs / 'trainer-config.yaml'}" in text
    trainer = config["trainer"]  # the job's --smoke sizing, as the trainer got it
    assert (trainer["nnodes"], trainer["n_gpus_per_node"], trainer["save_freq"], trainer["resume_mode"]) == (
        1,
        1,
        1,
        "auto",
    ), trainer
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] job: " + last, lines[-1]), lines[-1]


def wait_for(what: str, check, job: subprocess.Popen, output: Path, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        tail = output.read_text()[-6000:]
        assert job.poll() is None, f"the job ended (status {job.returncode}) before the {what}:\n{tail}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s}s:\n{tail}"
        time.sleep(0.5)


def test_the_slurm_job_trains_on_two_ray_nodes_stops_when_cancelled_and_resumes_when_requeued(
    bundled_index_dir: Path, tmp_path: Path
) -> None:
    # Ray's socket paths must stay under 108 bytes: the nodes' temporary directories are short ones
    with tempfile.TemporaryDirectory(prefix="sbatch-", dir="/tmp") as nodes:
        job = SlurmJob(tmp_path, bundled_index_dir, Path(nodes))
        unplaceable_replica_run(job)
        first_run(job)
        requeued_run(job)
    check_evinote_run(job.both_runs())


def unplaceable_replica_run(job: SlurmJob) -> None:
    """A server node whose replicas ask for more CPUs (16) than srun gave its step (8): the job ends within a minute of
    Serve's first word on it, with Serve's reason and the setting to change, not after RETRIEVAL_START_TIMEOUT."""
    output = job.tmp_path / "run0.out"
    process, mark = job.start(output, NODES="node1 node3", RETRIEVAL_NODE="last", RETRIEVAL_CPUS="16")
    started = time.monotonic()
    try:
        process.wait(timeout=600)
    finally:
        left = wait_until_gone(mark) if process.poll() is not None else scancel(mark)
    took = time.monotonic() - started
    text = output.read_text()
    assert process.returncode == 1, text[-6000:]
    assert not left, f"processes of the job outlived its end: {left}"
    ending = text.splitlines()[-1]
    assert "job: failed at stage server: Serve cannot place a replica of retrieval/" in ending, text[-6000:]
    assert 'Resources required for each replica: {"CPU": 16' in ending and "RETRIEVAL_CPUS=16" in ending, ending
    assert "(8 CPUs: sbatch --cpus-per-task" in ending and "lower RETRIEVAL_CPUS" in ending, ending
    # from the server step's start (its index loads, its Ray starts, Serve waits 20 s before it says so) to the end
    server_started = clock(re.search(r"^\[(\S+)\] setup: retrieval token of the server", text, re.M)[1])
    assert clock(ending[1:9]) - server_started < 150 and took < 300, f"{took:.0f} s:\n{text[-4000:]}"
    assert not (job.logs / "trainer.log").exists()
    (job.tmp_path / "srun.log").unlink()  # the next run's steps are checked on their own


def clock(hh_mm_ss: str) -> int:
    hours, minutes, seconds = map(int, hh_mm_ss.split(":"))
    return (hours * 60 + minutes) * 60 + seconds


def first_run(job: SlurmJob) -> None:
    output = job.tmp_path / "run1.out"
    ray_token, server_token = uuid.uuid4().hex, uuid.uuid4().hex  # the user's own, given to the job
    process, mark = job.start(output, RAY_AUTH_TOKEN=ray_token, RETRIEVAL_SERVER_TOKEN=server_token)
    url = f"http://127.0.0.1:{job.env['RETRIEVAL_PORT']}"
    server_log = job.logs / "retrieval-server.log"
    try:
        wait_for("server", lambda: server_log.is_file() and "retrieval server ready" in server_log.read_text(),
                 process, output)  # fmt: skip
        # The server, from outside the job: behind the job's token
        question = {"queries": ["Where do the two Niles meet?"], "topk": 1}
        assert httpx.post(f"{url}/retrieve", json=question, timeout=30).status_code == 401
        auth = {"Authorization": f"Bearer {server_token}"}
        hits = httpx.post(f"{url}/retrieve", json=question, headers=auth, timeout=30).json()
        assert len(hits["result"][0]) == 1, hits
        # The cluster, as a driver with the job's Ray token sees it
        address = f"127.0.0.1:{_ray_port(output)}"
        probe = subprocess.run(
            [sys.executable, "-c", CLUSTER_PROBE],
            capture_output=True,
            text=True,
            timeout=300,
            env={**job.env, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_token},
        )
        assert probe.returncode == 0, probe.stderr[-3000:]
        nodes = json.loads(probe.stdout.strip().splitlines()[-1])
        assert len(nodes) == 2 and all(n["CPU"] == 8 and n["GPU"] == 1 for n in nodes), nodes  # --cpus-per-task
        head = next(n for n in nodes if "retrieval_host" in n)
        assert sum("retrieval_host" in n for n in nodes) == 1 and head["left"] == 999, nodes  # the replica: the head
        latest = job.checkpoints / "latest_checkpointed_iteration.txt"

        def step_1_saved() -> bool:  # verl writes the checkpoint, then logs the step (the .out: its one line)
            saved = latest.is_file() and latest.read_text().strip() == "1"
            return saved and "] training: step 1 done" in output.read_text()

        wait_for("checkpoint of step 1", step_1_saved, process, output)
        metrics = httpx.get(f"{url}/metrics", headers=auth, timeout=10).text
    finally:
        left = scancel(mark)  # during step 2
        process.wait(timeout=60)
    text = output.read_text()
    assert not left, f"processes of the job outlived SIGTERM for {GRACE_S}s: {left}\n{text[-4000:]}"
    assert process.returncode == 143, text[-4000:]
    assert not address_files(job.nodes), "Ray's address file outlived the job"
    assert latest.read_text().strip() == "1", text[-4000:]  # step 2 never completed
    assert "setup: Ray: RAY_AUTH_MODE=token" in text and ray_token not in text and server_token not in text
    check_the_out_reads(
        text, re.escape("cancelled at step 2 (TERM to the job; step 1 was the last one done)"), job.logs
    )
    trainer = job.logs / "trainer.log"
    assert {int(s) for s in STEP_LINE.findall(trainer.read_text())} == {1}
    shutil.copyfile(trainer, job.tmp_path / "trainer-run1.log")  # the requeued run's starts anew
    served = re.search(r'^retrieval_requests_total\{endpoint="retrieve",status="200"\} (\S+)', metrics, re.M)
    assert served and float(served[1]) > 1, metrics[-3000:]  # the rollouts' searches besides this test's one
    rows = dumped(job.dump, 1)
    assert sum(row["rollout"]["num_searches"] for row in rows) > 0
    assert all(row["rollout"]["search_errors"] == 0 for row in rows)
    assert 1 in read_metrics(job.metrics_file)  # verl's file logger, in the trainer's Ray workers on the cluster
    shutil.copyfile(job.metrics_file, job.first_run_metrics)  # the requeued run's logger starts the file anew
    srun_steps = (job.tmp_path / "srun.log").read_text().splitlines()
    assert srun_steps and all("--cpus-per-task=8 " in line for line in srun_steps), srun_steps


def _ray_port(output: Path) -> str:
    """The job's Ray port, from its '# N node(s); Ray head <node> (<ip>:<port>)' line."""
    return re.search(r"Ray head \S+ \([^:]+:(\d+)\)", output.read_text())[1]


def requeued_run(job: SlurmJob) -> None:
    output = job.tmp_path / "run2.out"
    # node1 trains (its Ray the whole training cluster: run 1 tested two Ray nodes), node3 only serves
    # RETRIEVAL_CPUS=4 on this 2-core machine: placed only because the server node's Ray advertises the step's 8
    process, mark = job.start(output, NODES="node1 node3", RETRIEVAL_NODE="last", RETRIEVAL_CPUS="4")
    try:
        process.wait(timeout=1200)
    finally:
        left = wait_until_gone(mark) if process.poll() is not None else scancel(mark)
    text = output.read_text()
    assert process.returncode == 0, text[-6000:]
    assert not left, f"processes of the job outlived its end: {left}"
    assert not address_files(job.nodes), "Ray's address file outlived the job"
    check_the_out_reads(text, r"trained to step 2 in \d+ s", job.logs)
    trainer = (job.logs / "trainer.log").read_text()
    shutil.copyfile(job.logs / "trainer.log", job.tmp_path / "trainer-run2.log")
    steps = {int(s) for s in STEP_LINE.findall(trainer)}  # (Ray's log forwarding may show a line twice)
    assert steps == {2}, f"the requeued run trained steps {steps}, not only step 2:\n{text[-4000:]}"
    assert re.search(r"\] trainer: resumed from \S+/global_step_1$", text, re.M), text  # the checkpoint verl loads
    assert (job.checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    # the step the first run was cancelled after is as whole as the one this run wrote
    assert checkpoint_files(job.checkpoints / "global_step_1") == checkpoint_files(job.checkpoints / "global_step_2")
    # the server on node3, on a Ray instance of its own (node3's temporary directory), searched by step 2's rollouts
    assert "setup: retrieval server on its own node: node3" in text and "setup: 1 node(s)" in text
    assert list((job.nodes / "node3" / "ray").glob("session_*")), "the server did not start a Ray of its own"
    assert sum(row["rollout"]["num_searches"] for row in dumped(job.dump, 2)) > 0
    assert "setup: Ray: token authentication, a token made for this job: sha256 " in text
    assert (job.home / ".ray" / "auth_token").read_text() == job.users_ray_token  # the user's file, untouched
