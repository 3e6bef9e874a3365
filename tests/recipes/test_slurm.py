"""recipes/slurm/train.sbatch: its DRY_RUN output, and its waits and failure paths with stand-ins for the cluster.

The failure paths (a step that fails, one that never becomes ready) run the job for real (not DRY_RUN) with
`srun`, `ray` and `verl-evidence` as small scripts on PATH and `import ray` finding a stub whose ``nodes()``
reports the nodes the fake `ray start` brought up; the job script itself, its readiness checks (the real
`python -c` probes, httpx against a real port) and its deadlines run unchanged. The job with a real Ray, server and
trainer (only `srun` standing in): tests/recipes/test_slurm_job.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# fake job steps' sleeps and deadlines for ~15 CPU-s in all (82 s wall on a loaded 2-core machine; tests/scheduling.py)
pytestmark = pytest.mark.mostly_waits

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "recipes" / "slurm" / "train.sbatch"

# srun stand-in (all the job's tests, the real run's too): one step on this machine. `-w <node>` gives the step that
# node's own temporary directory ($SRUN_NODES/<node>, when there) as a machine of its own would have; a step without
# --cpus-per-task is refused (since Slurm 22.05 a step does not take it from sbatch: it would get one CPU), its value
# reaching the step as SLURM_CPUS_PER_TASK. TERM/INT go on to the whole step, which srun then waits for.
SRUN = """#!/usr/bin/env bash
node="" cpus=""
while [ $# -gt 0 ]; do
  case "$1" in
    -w) node="$2"; shift 2 ;;
    --cpus-per-task=*) cpus="${1#*=}"; shift ;;
    -*) shift ;;
    *) break ;;
  esac
done
echo "-w $node --cpus-per-task=${cpus:-none} $1" >> "$SRUN_LOG"
if [ -z "$cpus" ]; then echo "srun: a step without --cpus-per-task gets 1 CPU (Slurm >= 22.05)" >&2; exit 1; fi
export SLURM_CPUS_PER_TASK="$cpus"
if [ -n "${SRUN_NODES:-}" ] && [ -d "$SRUN_NODES/$node" ]; then export TMPDIR="$SRUN_NODES/$node"; fi
setsid "$@" &
step=$!
trap 'kill -TERM -- "-$step" 2>/dev/null' TERM INT
status=0
wait "$step" || status=$?
while kill -0 "$step" 2>/dev/null; do wait "$step" || status=$?; done
exit "$status"
"""

FAKE_RAY = """#!/usr/bin/env bash
echo "ray $*"
echo $$ >> "$FAKE_STATE/pids"
# what the Ray workers on this node inherit: the search clients' token (its hash)
printf '%s' "${VERL_EVIDENCE_RETRIEVAL_TOKEN:-none}" | sha256sum | cut -c1-12 >> "$FAKE_STATE/ray-token"
case "$FAKE_RAY" in
  fail) echo "RuntimeError: Failed to start the GCS server: port $RAY_PORT is already in use" >&2; exit 1 ;;
  hang) echo "waiting for the GCS..."; exec sleep 600 ;;
  up) echo node >> "$FAKE_STATE/alive"; exec sleep 600 ;;
esac
"""

STUB_RAY_MODULE = """import os
from types import SimpleNamespace


def init(*args, **kwargs):
    pass


def nodes():
    path = os.path.join(os.environ["FAKE_STATE"], "alive")
    count = len(open(path).read().split()) if os.path.exists(path) else 0
    return [{"Alive": True} for _ in range(count)]


class serve:  # Serve's status() as a controller answers it: the retrieval deployment's message is FAKE_SERVE_MESSAGE
    @staticmethod
    def status():
        deployment = SimpleNamespace(status="UPDATING", message=os.environ.get("FAKE_SERVE_MESSAGE", ""))
        application = SimpleNamespace(status="DEPLOYING", deployments={"RetrievalServer": deployment})
        return SimpleNamespace(applications={"retrieval": application})
"""

FAKE_VERL_EVIDENCE = """#!/usr/bin/env bash
echo "verl-evidence $*"
echo $$ >> "$FAKE_STATE/pids"
printf '%s' "${RETRIEVAL_SERVER_TOKEN:-none}" | sha256sum | cut -c1-12 > "$FAKE_STATE/server-token"
echo "RAY_ADDRESS=${RAY_ADDRESS:-unset} RAY_OVERRIDE_RESOURCES=${RAY_OVERRIDE_RESOURCES:-unset} args=$*" \
  > "$FAKE_STATE/server-env"
port=""
while [ $# -gt 0 ]; do if [ "$1" = --port ]; then port="$2"; fi; shift; done
case "$FAKE_SERVER" in
  fail) echo "IndexMismatchError: /shared/index/wiki18/index.faiss holds 10 vectors" \
          "but docstore.arrow holds 12 passages" >&2; exit 1 ;;
  hang) echo "loading the index..."; exec sleep 600 ;;
  up) mkdir -p "$FAKE_STATE/www" && echo ok > "$FAKE_STATE/www/health"
      exec python -m http.server --bind 127.0.0.1 --directory "$FAKE_STATE/www" "$port" ;;
esac
"""

# The recipe stand-in: FAKE_TRAINER=train logs two steps as verl does; `addrinuse` dies in verl's process-group set-up
# for its first FAIL_STARTS starts (then trains); `long` trains step 1 and then runs as a recipe does, its trainer a
# foreground child of its shell (which holds a TERM until the child ends).
FAKE_RECIPE = """#!/usr/bin/env bash
case " $* " in
  *" --cfg job --resolve "*)  # Hydra's config print, after the recipe's lines and its trainer command
    printf '%s\\n' "# retrieval server: x" "# trainer:" "python -m verl.trainer.main_ppo \\\\" "    --cfg job" \\
      "actor_rollout_ref:" "  model:" "    path: /smoke/policy"
    exit 0 ;;
esac
echo "trainer ran: RAY_ADDRESS=$RAY_ADDRESS RETRIEVAL_URL=$RETRIEVAL_URL NNODES=$NNODES args=$*"
echo "trainer token: $(printf '%s' "${VERL_EVIDENCE_RETRIEVAL_TOKEN:-none}" | sha256sum | cut -c1-12)"
echo "PYTHON=${PYTHON:-unset} SAVE_FREQ=${SAVE_FREQ:-unset} RESUME_MODE=${RESUME_MODE:-unset} GPUS=$GPUS_PER_NODE"
echo "# retrieval server: $RETRIEVAL_URL"
echo $$ >> "$FAKE_STATE/pids"
echo start >> "$FAKE_STATE/trainer-starts"
echo "(TaskRunner pid=7) {'actor_rollout_ref': {'actor': {'strategy': 'fsdp2'},"
echo "(TaskRunner pid=7)                        'model': {'path': '/smoke/policy'}}}"
for _ in 1 2 3; do echo "(WorkerDict pid=8) UserWarning: target_num_threads 8 should not exceed total cores 2"; done
case "${FAKE_TRAINER:-train}" in
  addrinuse)
    if [ "$(wc -l < "$FAKE_STATE/trainer-starts")" -le "${FAIL_STARTS:-99}" ]; then
      echo "(TaskRunner pid=7) torch.distributed.DistNetworkError: The server socket has failed to listen on any" \
        "local network address. port: 41234, useIpv6: false, code: -98, name: EADDRINUSE," \
        "message: address already in use"
      echo "ray.exceptions.RayTaskError(DistNetworkError): ray::TaskRunner.run() (pid=7, ip=127.0.0.1)"
      exit 1
    fi ;;
  long)
    echo "(TaskRunner pid=7) step:1 - critic/score/mean:0.5 - timing_s/step:3.2"
    bash -c 'echo $$ >> "$FAKE_STATE/pids"; exec sleep 300'
    exit 0 ;;
esac
echo "(TaskRunner pid=7) step:1 - critic/score/mean:0.25 - timing_s/step:4.6"
echo "(TaskRunner pid=7) step:2 - critic/score/mean:0.5 - timing_s/step:4.1"
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # an orphan zombie waits for a reaper but runs nothing


def run_job(
    tmp_path: Path,
    ray: str,
    server: str = "hang",
    *,
    args: tuple[str, ...] = ("trainer.total_epochs=1",),
    term_when: tuple[str, str] | None = None,
    **env: str,
) -> tuple[subprocess.CompletedProcess, Path]:
    """The job with stand-ins; the user's retrieval token variables are cleared unless given in ``env``.

    ``term_when``: (a log of the job's log directory, a text): once that log shows the text, SIGTERM to the batch
    script alone (`kill`, `scancel --batch`).
    """
    bin_dir, state, modules, logs = (tmp_path / name for name in ("bin", "state", "modules", "logs"))
    for directory in (bin_dir, state, modules, tmp_path / "repo" / "recipes"):
        directory.mkdir(parents=True, exist_ok=True)
    for name, text in {"srun": SRUN, "ray": FAKE_RAY, "verl-evidence": FAKE_VERL_EVIDENCE}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (modules / "ray.py").write_text(STUB_RAY_MODULE)
    (tmp_path / "repo" / "recipes" / "evinote_grpo.sh").write_text(FAKE_RECIPE)
    (tmp_path / "repo" / "recipes" / "slurm").mkdir(exist_ok=True)
    for script in ("slurm/ray_node.sh", "slurm/server_node.sh", "slurm/serve_status.py", "_python.sh"):
        shutil.copy(REPO / "recipes" / script, tmp_path / "repo" / "recipes" / script)
    job_env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": f"{modules}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "FAKE_STATE": str(state),
        "SRUN_LOG": str(state / "srun.log"),
        "FAKE_RAY": ray,
        "FAKE_SERVER": server,
        "NODES": "node1 node2",
        "HEAD_IP": "127.0.0.1",
        "HEAD_START_S": "0",
        "RAY_PORT": str(_free_port()),
        "RETRIEVAL_PORT": str(_free_port()),
        "REPO": str(tmp_path / "repo"),
        "SETUP": "true",
        "LOG_DIR": str(logs),
        "CHECK_INTERVAL": "0.2",
        "SERVER_ARGS": "--index-dir /shared/index/wiki18",  # the stand-in server ignores it; no index: see below
        "PYTHON": sys.executable,  # what the job's probes run (the stand-in repository has no .venv)
        "TRAINER_RETRY_PAUSE_S": "0",
        **env,
    }
    job_env.pop("DRY_RUN", None)
    for name in ("RETRIEVAL_SERVER_TOKEN", "VERL_EVIDENCE_RETRIEVAL_TOKEN", "RETRIEVAL_URL"):
        if name not in env:
            job_env.pop(name, None)
    job = subprocess.Popen(
        ["bash", str(SBATCH), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=job_env,
        cwd=tmp_path,
    )
    try:
        if term_when is not None:
            deadline = time.monotonic() + 60
            log, text = logs / term_when[0], term_when[1]
            while job.poll() is None and time.monotonic() < deadline:
                if log.exists() and text in log.read_text():
                    break
                time.sleep(0.1)
            job.send_signal(signal.SIGTERM)
        # No deadline is set below 2 s: a job that ignores its deadline would hit this 120 s limit instead.
        stdout, stderr = job.communicate(timeout=120)
        result = subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
        pids_file = state / "pids"
        pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        leftovers = [p for p in pids if _alive(p)]
        for pid in leftovers:  # only our own stand-ins, so that a failing test leaves nothing running
            os.kill(pid, 9)
    assert not leftovers, f"the job left its background steps running: {leftovers}"
    return result, logs


def trainer_output(logs: Path) -> str:
    """What the job's trainer (the recipe stand-in) wrote: the job keeps it in its log directory, not the .out."""
    path = logs / "trainer.log"
    return path.read_text() if path.exists() else ""


def last_line(result: subprocess.CompletedProcess) -> str:
    """The job's last line: how it ended."""
    lines = result.stdout.splitlines()
    return lines[-1] if lines else ""


def test_ray_head_that_fails_to_start_ends_the_job_at_once_with_its_log(tmp_path):
    result, logs = run_job(tmp_path, ray="fail")  # default RAY_START_TIMEOUT (600 s): the job must not wait it out
    assert result.returncode == 1, result.stdout + result.stderr
    # Every `ray start` fails here, the head's and the worker's: whichever step the wait sees exit first is named
    # (on a loaded machine the worker's can end first), with that step's log.
    failed = re.search(
        rf"ERROR: waiting for 2 Ray node\(s\): step '{re.escape(str(logs))}/(ray-head-node1|ray-worker-node2)\.log' "
        r"exited with status 1",
        result.stderr,
    )
    assert failed, result.stderr
    assert f"---- last lines of {logs}/{failed.group(1)}.log ----" in result.stderr
    assert "Failed to start the GCS server: port" in result.stderr
    assert "verl-evidence serve" not in result.stdout and not trainer_output(logs)
    ending = last_line(result)
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] job: failed at stage ray: waiting for 2 Ray node\(s\): .+", ending), ending
    assert "RuntimeError: Failed to start the GCS server: port" in ending and " — its last lines are above" in ending


def test_ray_that_never_becomes_ready_ends_the_job_at_its_deadline(tmp_path):
    result, logs = run_job(tmp_path, ray="hang", RAY_START_TIMEOUT="2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ERROR: 2 Ray node(s) not ready after 2s; giving up" in result.stderr
    for log in ("ray-head-node1.log", "ray-worker-node2.log"):  # every step of this wait shows its tail
        assert f"---- last lines of {logs}/{log} ----" in result.stderr
    assert "ray start --head --node-ip-address=127.0.0.1" in result.stderr and "waiting for the GCS..." in result.stderr
    assert "waiting for 2 Ray node(s)" in result.stdout
    assert "verl-evidence serve" not in result.stdout


def test_retrieval_server_that_fails_to_start_ends_the_job_with_its_log(tmp_path):
    result, logs = run_job(tmp_path, ray="up", server="fail")  # default RETRIEVAL_START_TIMEOUT (1800 s)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        f"ERROR: waiting for the retrieval server: step '{logs}/retrieval-server.log' exited with status 1"
        in result.stderr
    )
    assert "IndexMismatchError: /shared/index/wiki18/index.faiss holds 10 vectors" in result.stderr
    assert not trainer_output(logs)
    assert last_line(result).endswith(
        "job: failed at stage server: waiting for the retrieval server: step "
        f"'{logs}/retrieval-server.log' exited with status 1: IndexMismatchError: /shared/index/wiki18/index.faiss"
        " holds 10 vectors but docstore.arrow holds 12 passages — its last lines are above (all of it: "
        f"{logs}/retrieval-server.log)"
    ), last_line(result)


def test_retrieval_server_that_never_answers_ends_the_job_at_its_deadline(tmp_path):
    result, logs = run_job(tmp_path, ray="up", server="hang", RETRIEVAL_START_TIMEOUT="2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ERROR: the retrieval server not ready after 2s; giving up" in result.stderr
    assert (
        f"---- last lines of {logs}/retrieval-server.log ----" in result.stderr
        and "loading the index..." in result.stderr
    )
    assert "ray-head" not in result.stderr  # only the step this wait was for
    assert not trainer_output(logs)
    assert "job: failed at stage server: the retrieval server not ready after 2s" in last_line(result)


def test_job_whose_steps_come_up_runs_the_trainer_and_stops_the_steps(tmp_path):
    result, logs = run_job(tmp_path, ray="up", server="up")
    assert result.returncode == 0, result.stdout + result.stderr
    port = (
        next(line for line in result.stdout.splitlines() if "verl-evidence serve" in line)
        .split("--port ")[1]
        .split()[0]
    )
    trainer = trainer_output(logs)
    assert f"RETRIEVAL_URL=http://127.0.0.1:{port} NNODES=2 args=trainer.total_epochs=1" in trainer
    assert "trainer ran: RAY_ADDRESS=127.0.0.1:" in trainer
    assert f"PYTHON={sys.executable} " in trainer  # the job's interpreter, given to the recipe
    assert "ERROR" not in result.stderr
    # run_job also asserted that every stand-in (2 Ray nodes, the server) was stopped when the job ended

    # The .out: the job's own lines, each `[HH:MM:SS] stage: ...` (the commands it runs: `+ ...`), one a training
    # step; verl's config and the trainer's warnings stay in the log directory; the last line says how it ended.
    out = result.stdout
    own = [line for line in out.splitlines() if not line.startswith("+ ")]
    assert all(re.match(r"\[\d\d:\d\d:\d\d\] [a-z]+: ", line) for line in own), own
    assert re.search(r"\] ray: 2 Ray node\(s\) joined \(took \d+ s\)$", out, re.M), out
    assert re.search(r"\] server: the retrieval server answers at http://127.0.0.1:\d+ \(took \d+ s\)$", out, re.M)
    assert f"trainer: the trainer's output: {logs}/trainer.log" in out and "trainer: retrieval server: http://" in out
    config = logs / "trainer-config.yaml"
    assert f"trainer: its resolved config: {config}" in out and "actor_rollout_ref" not in out
    assert config.read_text() == "actor_rollout_ref:\n  model:\n    path: /smoke/policy\n"
    assert (
        "] training: step 1 done, mean score 0.250 (took 5 s)" in out
        and "step 2 done, mean score 0.500 (took 4 s)" in out
    )
    assert "] training: 3 warning lines in its log; the most frequent (3x): UserWarning: target_num_threads" in out
    assert "should not exceed" not in out.replace(
        "the most frequent (3x): UserWarning: target_num_threads 8 should", ""
    )
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] job: trained to step 2 in \d+ s", last_line(result)), out


def test_term_to_the_batch_script_alone_reaches_the_trainer_and_the_job_says_it_was_cancelled(tmp_path):
    """`kill <batch script>` or `scancel --batch`: bash holds a trap while a foreground child runs, so the trainer once
    trained on to its end. Here the recipe's trainer (a `sleep 300` in the foreground of the recipe's shell) stops at
    once, every step with it (run_job asserts that), and the job says what it cancelled."""
    result, _ = run_job(tmp_path, ray="up", server="up", term_when=("trainer.log", "step:1 "), FAKE_TRAINER="long")
    assert result.returncode == 143, result.stdout + result.stderr
    assert last_line(result).endswith("job: cancelled at step 2 (TERM to the job; step 1 was the last one done)")


def test_a_job_cancelled_before_its_trainer_started_says_at_which_stage(tmp_path):
    result, _ = run_job(
        tmp_path, ray="hang", term_when=("ray-head-node1.log", "waiting for the GCS"), CHECK_INTERVAL="30"
    )
    assert result.returncode == 143, result.stdout + result.stderr
    assert last_line(result).endswith("job: cancelled at stage ray (TERM to the job)"), result.stdout


def test_a_trainer_start_that_loses_its_rendezvous_port_is_started_again(tmp_path):
    """verl's process-group set-up binds a port picked free earlier: EADDRINUSE when another process took it since."""
    result, logs = run_job(tmp_path, ray="up", server="up", FAKE_TRAINER="addrinuse", FAIL_STARTS="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "state" / "trainer-starts").read_text().split() == ["start", "start"]
    assert "EADDRINUSE" in (logs / "trainer-attempt1.log").read_text()
    assert "trainer: its start failed binding torch.distributed's port (EADDRINUSE" in result.stdout
    assert "starting it again (attempt 2 of 3;" in result.stdout
    assert re.search(r"job: trained to step 2 in \d+ s$", last_line(result))


def test_a_trainer_that_keeps_losing_its_port_fails_the_job_with_one_line_naming_cause_and_fix(tmp_path):
    result, _ = run_job(
        tmp_path, ray="up", server="up", FAKE_TRAINER="addrinuse", FAIL_STARTS="9", TRAINER_START_ATTEMPTS="2"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert (tmp_path / "state" / "trainer-starts").read_text().split() == ["start", "start"]
    ending = last_line(result)
    assert "job: failed at stage trainer: torch.distributed.DistNetworkError: The server socket has failed" in ending
    assert "name: EADDRINUSE" in ending and "RayTaskError" not in ending  # the cause, not Ray's wrapper
    assert "started the trainer 2 times" in ending and "TRAINER_START_ATTEMPTS" in ending
    assert "docs/troubleshooting.md" in ending


def test_a_replica_serve_cannot_place_ends_the_wait_with_serves_reason_and_the_setting_to_change(tmp_path):
    """Serve's reason, from its status() (recipes/slurm/serve_status.py), not `waiting for the retrieval server` until
    RETRIEVAL_START_TIMEOUT."""
    reason = (
        "Deployment 'RetrievalServer' in application 'retrieval' has 1 replicas that have taken more than 20s to be "
        "scheduled. This may be due to waiting for the cluster to auto-scale or for a runtime environment to be "
        'installed. Resources required for each replica: {"CPU": 16.0, "retrieval_host": 1.0}, total resources '
        'available: {"CPU": 8.0, "retrieval_host": 1000.0}. Use `ray status` for more details.'
    )
    result, _ = run_job(
        tmp_path, ray="up", server="hang", FAKE_SERVE_MESSAGE=reason, SERVE_STATUS_AFTER="0", RETRIEVAL_CPUS="16",
        CPUS_PER_NODE="8",
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    ending = last_line(result)
    assert (
        "job: failed at stage server: Serve cannot place a replica of retrieval/RetrievalServer: Resources required "
        'for each replica: {"CPU": 16.0, "retrieval_host": 1.0}, total resources available: {"CPU": 8.0, '
        '"retrieval_host": 1000.0}. — RETRIEVAL_CPUS=16 and RETRIEVAL_GPUS=0 per replica'
    ) in ending, ending
    assert "more than Ray has on node1 (8 CPUs" in ending and "lower RETRIEVAL_CPUS" in ending


def test_the_jobs_smoke_mode_sizes_itself_for_cpu_nodes_and_saves_and_resumes(tmp_path):
    """`sbatch recipes/slurm/train.sbatch --smoke` under the #SBATCH lines' 8 GPUs a node: one logical GPU a Ray node,
    the trainer on one node, a checkpoint every step, resumed when requeued; the demo corpus is what it serves."""
    result, logs = run_job(tmp_path, ray="up", server="up", args=("--smoke",), SLURM_GPUS_PER_NODE="8", SERVER_ARGS="")
    assert result.returncode == 0, result.stdout + result.stderr
    trainer = trainer_output(logs)
    assert "NNODES=1 args=--smoke" in trainer and "SAVE_FREQ=1 RESUME_MODE=auto GPUS=1" in trainer, trainer
    assert "--num-gpus=1 " in (logs / "ray-head-node1.log").read_text()


def dry_run(tmp_path: Path, *args: str, script: Path = SBATCH, **env: str) -> subprocess.CompletedProcess:
    """The job with DRY_RUN=1 from ``tmp_path`` (not the repository), its SETUP a command that leaves a file."""
    settings = {"DRY_RUN": "1", "NODES": "n1", "SETUP": f"touch {tmp_path / 'setup-ran'}", "PYTHON": "python", **env}
    base = {k: v for k, v in os.environ.items() if k not in ("REPO", "SLURM_SUBMIT_DIR", "RAY_AUTH_TOKEN")}
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env={**base, **settings}, cwd=tmp_path, timeout=60
    )


def test_deadlines_are_in_the_dry_run_free_of_side_effects(tmp_path):
    result = dry_run(tmp_path, RECIPE="grace_dapo.sh")
    assert result.returncode == 0, result.stderr
    assert "> logs/steps-" in result.stdout and "/ray-head-n1.log &" in result.stdout
    assert not (tmp_path / "logs").exists()  # a dry run creates nothing
    assert f"+ touch {tmp_path / 'setup-ran'}" in result.stdout and not (tmp_path / "setup-ran").exists()


def test_slurm_dry_run(tmp_path: Path) -> None:
    """From any directory (the repository found from the script's path): every step in order, each srun step with
    the node's CPUs (Slurm >= 22.05 steps do not inherit --cpus-per-task), the trainer command last."""
    from recipes.test_recipes import overrides, trainer_argv

    result = dry_run(tmp_path, "trainer.total_epochs=2", NODES="gpu01 gpu02 gpu03", RETRIEVAL_REPLICAS="3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count(" --head --node-ip-address=gpu01 ") == 1 and out.count(" --address=gpu01:6379 ") == 2
    steps = [line for line in out.splitlines() if line.startswith("+ srun ")]
    assert [line.split(" -w ")[1].split()[0] for line in steps] == ["gpu01", "gpu02", "gpu03"]
    assert all("srun --nodes=1 --ntasks=1 --cpus-per-task=64 -w" in line for line in steps), steps
    assert f"bash {REPO}/recipes/slurm/ray_node.sh 6379 --head" in out
    assert "verl-evidence serve --address auto --host 0.0.0.0 --port 8000 --replicas 3" in out
    assert out.index(" --head ") < out.index("verl-evidence serve") < out.index("# trainer:")
    values = overrides(trainer_argv(out))
    assert values["trainer.nnodes"] == "3"
    assert values["actor_rollout_ref.rollout.custom.evidence_search.retrieval_url"] == "http://gpu01:8000"
    assert trainer_argv(out)[-1] == "trainer.total_epochs=2"
    assert f"--config-path={REPO}/recipes/presets" in trainer_argv(out)
    assert "setup: Ray: token authentication, a token made for this job: sha256 " in out
    no_search = dry_run(tmp_path, RECIPE="grace_dapo.sh", NODES="gpu01")
    assert no_search.returncode == 0 and "verl-evidence serve" not in no_search.stdout


def test_under_sbatch_the_repository_is_the_submit_directory(tmp_path: Path) -> None:
    """sbatch runs a copy of the script from its spool directory: no recipes/ beside it, so SLURM_SUBMIT_DIR."""
    spool = tmp_path / "spool" / "job4242"
    spool.mkdir(parents=True)
    shutil.copy(SBATCH, spool / "slurm_script")
    copied = dry_run(tmp_path, script=spool / "slurm_script", SLURM_SUBMIT_DIR=str(REPO), RECIPE="grace_dapo.sh")
    assert copied.returncode == 0, copied.stderr
    assert f"--config-path={REPO}/recipes/presets" in copied.stdout
    elsewhere = dry_run(tmp_path, script=spool / "slurm_script", RECIPE="grace_dapo.sh")  # submitted from tmp_path
    assert elsewhere.returncode == 2 and "ERROR: no recipe" in elsewhere.stderr, elsewhere.stderr
    assert f"{tmp_path}/recipes/grace_dapo.sh" in elsewhere.stderr and "REPO=" in elsewhere.stderr


def test_ray_start_options_reach_every_node_and_head_options_only_the_head(tmp_path: Path) -> None:
    """`ray start` refuses head-only options (--include-dashboard) on a worker: RAY_HEAD_ARGS is for the head only."""
    result = dry_run(
        tmp_path, RECIPE="grace_dapo.sh", NODES="gpu01 gpu02",
        RAY_START_ARGS="--object-store-memory=1000000000", RAY_HEAD_ARGS="--include-dashboard=false",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    head, worker = (line for line in result.stdout.splitlines() if line.startswith("+ srun "))
    assert "--num-cpus=64 --object-store-memory=1000000000 --include-dashboard=false >" in head, head
    assert "--num-cpus=64 --object-store-memory=1000000000 >" in worker and "dashboard" not in worker, worker
    plain = dry_run(tmp_path, RECIPE="grace_dapo.sh", NODES="gpu01 gpu02").stdout
    assert "--num-cpus=64 >" in plain and "--num-cpus=64  " not in plain


def test_rays_authentication_is_set_for_every_step(tmp_path: Path) -> None:
    made = dry_run(tmp_path, RECIPE="grace_dapo.sh")
    assert "setup: Ray: token authentication, a token made for this job: sha256 " in made.stdout
    own = dry_run(tmp_path, RECIPE="grace_dapo.sh", RAY_AUTH_TOKEN_PATH="/shared/ray-token")
    assert "setup: Ray: RAY_AUTH_MODE=token (token: /shared/ray-token)" in own.stdout
    off = dry_run(tmp_path, RECIPE="grace_dapo.sh", RAY_AUTH_MODE="disabled")
    assert "setup: Ray: RAY_AUTH_MODE=disabled" in off.stdout


@pytest.mark.parametrize(
    "variable",
    [
        "RAY_START_TIMEOUT",
        "RETRIEVAL_START_TIMEOUT",
        "CHECK_INTERVAL",
        "CHECK_TIMEOUT",
        "STOP_TIMEOUT",
        "LOG_DIR",
        "SERVE_STATUS_AFTER",
        "SERVE_STATUS_INTERVAL",
        "TRAINER_START_ATTEMPTS",
        "PYTHON",
    ],  # fmt: skip
)
def test_wait_settings_are_documented(variable):
    assert f"`{variable}`" in (REPO / "recipes" / "slurm" / "README.md").read_text()


def test_job_that_would_serve_the_demo_corpus_refuses_before_starting_ray(tmp_path):
    result, _ = run_job(tmp_path, ray="up", server="up", SERVER_ARGS="")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "would serve the bundled demo corpus" in result.stderr
    assert 'SERVER_ARGS="--index-dir' in result.stderr and "RETRIEVAL_URL=" in result.stderr
    assert "ray start" not in result.stdout and not trainer_output(tmp_path / "logs")


def test_job_asked_for_the_demo_corpus_or_given_a_server_runs(tmp_path):
    allowed, _ = run_job(tmp_path / "allowed", ray="up", server="up", SERVER_ARGS="", ALLOW_DEMO_CORPUS="1")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "trainer ran" in trainer_output(tmp_path / "allowed" / "logs")
    given, given_logs = run_job(
        tmp_path / "given", ray="up", server="up", SERVER_ARGS="", RETRIEVAL_URL="http://10.1.2.3:8123"
    )
    assert given.returncode == 0, given.stdout + given.stderr
    assert "verl-evidence serve" not in given.stdout  # the user's own server: none started
    assert "RETRIEVAL_URL=http://10.1.2.3:8123 " in trainer_output(given_logs)


def fingerprint(token: str) -> str:
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()[:12]


def test_the_job_makes_a_token_that_reaches_the_server_every_ray_node_and_the_trainer(tmp_path):
    result, logs = run_job(tmp_path, ray="up", server="up")
    assert result.returncode == 0, result.stdout + result.stderr
    state = tmp_path / "state"
    server = (state / "server-token").read_text().strip()
    assert server != fingerprint("none")  # the server got a token
    assert (state / "ray-token").read_text().split() == [server, server]  # both nodes' Ray workers inherit it
    assert f"trainer token: {server}" in trainer_output(logs)
    assert f"server: retrieval token of the server: sha256 {server}" in result.stdout
    again, _ = run_job(tmp_path / "again", ray="up", server="up")
    assert (tmp_path / "again" / "state" / "server-token").read_text().strip() != server  # one per job


def test_a_users_token_is_used_as_given(tmp_path):
    result, logs = run_job(tmp_path, ray="up", server="up", RETRIEVAL_SERVER_TOKEN="s3cret-of-the-user")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "state" / "server-token").read_text().strip() == fingerprint("s3cret-of-the-user")
    assert f"trainer token: {fingerprint('s3cret-of-the-user')}" in trainer_output(logs)
    assert "s3cret-of-the-user" not in result.stdout + result.stderr + trainer_output(logs)


def test_dry_run_shows_the_same_token_for_server_and_trainer_without_its_value(tmp_path):
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "NODES": "n1 n2",
        "REPO": str(REPO),
        "SETUP": "true",
        "SERVER_ARGS": "--index-dir /shared/index",
        "RETRIEVAL_SERVER_TOKEN": "tok-123456",
    }
    env.pop("VERL_EVIDENCE_RETRIEVAL_TOKEN", None)
    result = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"server: retrieval token of the server: sha256 {fingerprint('tok-123456')}" in out
    assert f"# retrieval token of the search clients: sha256 {fingerprint('tok-123456')}" in out
    assert "tok-123456" not in out + result.stderr
    env.pop("RETRIEVAL_SERVER_TOKEN")
    made = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    server = made.stdout.split("retrieval token of the server: sha256 ")[1].split()[0]
    clients = made.stdout.split("# retrieval token of the search clients: sha256 ")[1].split()[0]
    assert server == clients and len(server) == 12


def test_a_dedicated_server_node_stays_out_of_the_training_cluster(tmp_path):
    """RETRIEVAL_NODE=last: the server runs on that node with a Ray of its own, sized as srun gave the step (not as the
    machine is); Ray and the trainer use the rest."""
    result, logs = run_job(tmp_path, ray="up", server="up", NODES="node1 node2 node3", RETRIEVAL_NODE="last")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "setup: retrieval server on its own node: node3" in out
    server_step = f"-w node3 bash -c true && exec bash {tmp_path}/repo/recipes/slurm/server_node.sh --host 0.0.0.0"
    assert server_step in out
    assert "ray_node.sh" not in "".join(line for line in out.splitlines() if "-w node3" in line)
    assert out.count("ray_node.sh") == 2 and out.count(" --head --node-ip") == 1  # the head and node2 only
    server = (tmp_path / "state" / "server-env").read_text()
    assert server.startswith("RAY_ADDRESS=unset") and "--address" not in server
    # the srun step's CPUs (--cpus-per-task=64, the stand-in's SLURM_CPUS_PER_TASK), no GPU: what its Ray advertises
    assert 'RAY_OVERRIDE_RESOURCES={"CPU": 64, "GPU": 0} ' in server, server
    assert "NNODES=2 " in trainer_output(logs)


def test_a_retrieval_node_outside_the_job_or_the_head_is_refused(tmp_path):
    for node in ("node1", "elsewhere"):
        result, _ = run_job(tmp_path / node, ray="up", server="up", RETRIEVAL_NODE=node)
        assert result.returncode == 2 and f"RETRIEVAL_NODE={node} must name a node of this job" in result.stderr


def test_a_server_inside_the_training_cluster_is_pinned_to_the_head_node(tmp_path):
    """Only the head offers the server's Ray resource, and the replicas ask for it: no replica lands on a trainer."""
    result, logs = run_job(tmp_path, ray="up", server="up", NODES="node1 node2 node3")
    assert result.returncode == 0, result.stdout + result.stderr
    # What `ray` itself received on each node, after the srun step's shell parsed the quoting.
    head = (logs / "ray-head-node1.log").read_text()
    assert '--resources={"retrieval_host":1000} --block' in head, head
    for worker in ("node2", "node3"):
        assert "--resources" not in (logs / f"ray-worker-{worker}.log").read_text()
    server = (tmp_path / "state" / "server-env").read_text()
    assert "--address auto" in server and "--replica-resource retrieval_host=1" in server


def test_no_resource_is_offered_when_the_server_has_its_own_node(tmp_path):
    result, _ = run_job(tmp_path, ray="up", server="up", NODES="node1 node2 node3", RETRIEVAL_NODE="last")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--resources" not in result.stdout
    assert "--replica-resource" not in (tmp_path / "state" / "server-env").read_text()


# --- recipes/slurm/ray_node.sh: a node whose start-up fails is started again ---------------------------------------

RAY_FAILING_AT_FIRST = """#!/usr/bin/env bash
# `ray start` that times out at start-up for the first FAIL_STARTS calls, then runs until signalled.
echo "$$ $*" >> "$FAKE_STATE/attempts"
if [ "$(wc -l < "$FAKE_STATE/attempts")" -le "$FAIL_STARTS" ]; then
  sleep 300 &  # what a failed start leaves running (its raylet): in the start's process group
  echo $! >> "$FAKE_STATE/left"
  echo "Exception: The current node timed out during startup." >&2
  exit 1
fi
exec sleep 300
"""


def run_ray_node(tmp_path: Path, fail_starts: int, **env: str) -> tuple[subprocess.Popen, Path]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "ray").write_text(RAY_FAILING_AT_FIRST)
    (bin_dir / "ray").chmod(0o755)
    node = subprocess.Popen(
        ["bash", str(SBATCH.with_name("ray_node.sh")), "6399", "--address=127.0.0.1:6399"],
        env={
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "FAKE_STATE": str(state),
            "FAIL_STARTS": str(fail_starts),
            "RAY_NODE_RETRY_PAUSE_S": "0.2",
            "TMPDIR": str(tmp_path),
            **env,
        },
        stderr=subprocess.PIPE,
        text=True,
    )
    return node, state


def attempts_of(state: Path) -> list[str]:
    path = state / "attempts"
    return path.read_text().splitlines() if path.exists() else []


def test_a_ray_node_that_times_out_at_start_up_is_started_again_and_what_it_left_is_stopped(tmp_path):
    node, state = run_ray_node(tmp_path, fail_starts=1)
    deadline = time.monotonic() + 30
    while len(attempts_of(state)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(attempts_of(state)) == 2 and node.poll() is None  # started again, and now running
    left = int((state / "left").read_text())
    deadline = time.monotonic() + 10
    while _alive(left) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(left)  # the failed start's leftover process was stopped before the second start
    node.terminate()  # scancel: the signal reaches ray_node.sh, which passes it on to `ray start`
    _, stderr = node.communicate(timeout=30)
    assert node.returncode != 0
    assert "exited with status 1" in stderr and "attempt 2 of 3" in stderr
    assert all(line.endswith("--address=127.0.0.1:6399 --block") for line in attempts_of(state))


def test_a_ray_node_that_never_starts_gives_up_after_its_attempts_with_rays_status(tmp_path):
    node, state = run_ray_node(tmp_path, fail_starts=10, RAY_NODE_START_ATTEMPTS="2")
    _, stderr = node.communicate(timeout=60)
    assert node.returncode == 1
    assert len(attempts_of(state)) == 2 and stderr.count("timed out during startup") == 2
    assert "attempt 2 of 2" in stderr and "attempt 3" not in stderr


# --- the project's interpreter without an activated venv (recipes/_python.sh) ---------------------------------------


def bare_env(**env: str) -> dict[str, str]:
    """A shell as a user has it before activating anything: no venv on PATH, no PYTHON."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "REPO", "DRY_RUN", "SETUP")}
    return {**base, "PATH": "/usr/bin:/bin", **env}


def test_the_jobs_dry_run_with_smoke_finds_the_repositorys_venv_from_anywhere(tmp_path):
    """`DRY_RUN=1 … --smoke` outside the repository, nothing activated: the recipe's `smoke prepare` and the trainer
    command run the repository's .venv/bin/python (once `python` from PATH: ModuleNotFoundError: filelock)."""
    result = subprocess.run(
        ["bash", str(SBATCH), "--smoke"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, env=bare_env(DRY_RUN="1", NODES="n1 n2"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    command = shlex.split(result.stdout.split("# trainer:\n", 1)[1].replace("\\\n", " "))
    assert command[:3] == [str(REPO / ".venv" / "bin" / "python"), "-m", "verl.trainer.main_ppo"], command[:3]
    assert "trainer.n_gpus_per_node=1" in command and "trainer.nnodes=1" in command  # sized for CPU nodes
    assert "trainer.save_freq=1" in command and "trainer.resume_mode=auto" in command


def test_without_an_interpreter_that_has_the_project_recipe_and_job_stop_with_one_line_saying_what_to_do(tmp_path):
    """A copy of the recipes with no .venv beside them, PATH's python3 without the project: one line, no traceback."""
    copy = tmp_path / "checkout"
    shutil.copytree(REPO / "recipes", copy / "recipes")
    recipe = subprocess.run(
        ["bash", str(copy / "recipes" / "grace_dapo.sh"), "--smoke"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, env=bare_env(),
    )  # fmt: skip
    assert recipe.returncode == 2, recipe.stdout + recipe.stderr
    problem = [line for line in recipe.stderr.splitlines() if line.startswith("error: ")]
    assert problem == [line for line in recipe.stderr.splitlines() if "python" in line.lower()], recipe.stderr
    assert f"no {copy}/.venv" in problem[0] and "activate" in problem[0] and "PYTHON=" in problem[0], problem
    assert "Traceback" not in recipe.stderr
    job = subprocess.run(
        ["bash", str(copy / "recipes" / "slurm" / "train.sbatch")],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env=bare_env(NODES="n1", RECIPE="grace_dapo.sh", LOG_DIR=str(tmp_path / "logs")),
    )  # fmt: skip
    assert job.returncode == 2, job.stdout + job.stderr
    assert "job: failed at stage setup: no Python with verl-evidence installed" in job.stdout.splitlines()[-1]
    assert "srun" not in job.stdout  # stopped before any step


def test_a_python_given_by_the_user_is_used_as_given(tmp_path):
    result = subprocess.run(
        ["bash", str(REPO / "recipes" / "grace_dapo.sh"), "--dry-run"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, env=bare_env(PYTHON=sys.executable),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("# trainer:\n", 1)[1].startswith(f"{sys.executable} -m verl.trainer.main_ppo")


# --- temporary paths under TMPDIR -----------------------------------------------------------------------------------


def test_haproxys_work_directory_is_under_tmpdir_when_its_sockets_fit(tmp_path, monkeypatch):
    import tempfile

    from retrieval_server.haproxy_front import HAPROXY_WORKDIR_MAX_CHARS, haproxy_workdir

    short = Path(f"/tmp/j{os.getpid() % 10000:04d}")  # a job's TMPDIR short enough (Ray's node id and HAProxy's cap
    short.mkdir()  # leave HAProxy's directory 27 characters)
    try:
        monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
        monkeypatch.setenv("TMPDIR", str(short))
        assert haproxy_workdir(8000) == short / "rs-haproxy-8000"
        monkeypatch.setattr(tempfile, "tempdir", None)
        monkeypatch.setenv("TMPDIR", str(tmp_path))  # too long for HAProxy's socket paths: /tmp, said in a warning
        assert len(str(tmp_path / "rs-haproxy-8000")) > HAPROXY_WORKDIR_MAX_CHARS
        assert haproxy_workdir(8000) == Path("/tmp/rs-haproxy-8000")
    finally:
        short.rmdir()
