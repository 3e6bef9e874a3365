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
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# ~19 s of fake job steps' sleeps and deadlines for ~4 CPU-s (tests/scheduling.py)
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


def init(*args, **kwargs):
    pass


def nodes():
    path = os.path.join(os.environ["FAKE_STATE"], "alive")
    count = len(open(path).read().split()) if os.path.exists(path) else 0
    return [{"Alive": True} for _ in range(count)]
"""

FAKE_VERL_EVIDENCE = """#!/usr/bin/env bash
echo "verl-evidence $*"
echo $$ >> "$FAKE_STATE/pids"
printf '%s' "${RETRIEVAL_SERVER_TOKEN:-none}" | sha256sum | cut -c1-12 > "$FAKE_STATE/server-token"
echo "RAY_ADDRESS=${RAY_ADDRESS:-unset} args=$*" > "$FAKE_STATE/server-env"
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

FAKE_RECIPE = """#!/usr/bin/env bash
echo "trainer ran: RAY_ADDRESS=$RAY_ADDRESS RETRIEVAL_URL=$RETRIEVAL_URL NNODES=$NNODES args=$*"
echo "trainer token: $(printf '%s' "${VERL_EVIDENCE_RETRIEVAL_TOKEN:-none}" | sha256sum | cut -c1-12)"
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


def run_job(tmp_path: Path, ray: str, server: str = "hang", **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The job with stand-ins; the user's retrieval token variables are cleared unless given in ``env``."""
    bin_dir, state, modules, logs = (tmp_path / name for name in ("bin", "state", "modules", "logs"))
    for directory in (bin_dir, state, modules, tmp_path / "repo" / "recipes"):
        directory.mkdir(parents=True, exist_ok=True)
    for name, text in {"srun": SRUN, "ray": FAKE_RAY, "verl-evidence": FAKE_VERL_EVIDENCE}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (modules / "ray.py").write_text(STUB_RAY_MODULE)
    (tmp_path / "repo" / "recipes" / "evinote_grpo.sh").write_text(FAKE_RECIPE)
    (tmp_path / "repo" / "recipes" / "slurm").mkdir(exist_ok=True)
    shutil.copy(SBATCH.with_name("ray_node.sh"), tmp_path / "repo" / "recipes" / "slurm")
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
        **env,
    }
    job_env.pop("DRY_RUN", None)
    for name in ("RETRIEVAL_SERVER_TOKEN", "VERL_EVIDENCE_RETRIEVAL_TOKEN", "RETRIEVAL_URL"):
        if name not in env:
            job_env.pop(name, None)
    try:
        # No deadline is set below 2 s: a job that ignores its deadline would hit this 120 s limit instead.
        result = subprocess.run(
            ["bash", str(SBATCH), "trainer.total_epochs=1"],
            capture_output=True,
            text=True,
            env=job_env,
            cwd=tmp_path,
            timeout=120,
        )
    finally:
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
    assert "verl-evidence serve" not in result.stdout and "trainer ran" not in result.stdout


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
    assert "trainer ran" not in result.stdout


def test_retrieval_server_that_never_answers_ends_the_job_at_its_deadline(tmp_path):
    result, logs = run_job(tmp_path, ray="up", server="hang", RETRIEVAL_START_TIMEOUT="2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ERROR: the retrieval server not ready after 2s; giving up" in result.stderr
    assert (
        f"---- last lines of {logs}/retrieval-server.log ----" in result.stderr
        and "loading the index..." in result.stderr
    )
    assert "ray-head" not in result.stderr  # only the step this wait was for
    assert "trainer ran" not in result.stdout


def test_job_whose_steps_come_up_runs_the_trainer_and_stops_the_steps(tmp_path):
    result, _ = run_job(tmp_path, ray="up", server="up")
    assert result.returncode == 0, result.stdout + result.stderr
    port = (
        next(line for line in result.stdout.splitlines() if "verl-evidence serve" in line)
        .split("--port ")[1]
        .split()[0]
    )
    assert f"RETRIEVAL_URL=http://127.0.0.1:{port} NNODES=2 args=trainer.total_epochs=1" in result.stdout
    assert "trainer ran: RAY_ADDRESS=127.0.0.1:" in result.stdout
    assert "ERROR" not in result.stderr
    # run_job also asserted that every stand-in (2 Ray nodes, the server) was stopped when the job ended


def dry_run(tmp_path: Path, *args: str, script: Path = SBATCH, **env: str) -> subprocess.CompletedProcess:
    """The job with DRY_RUN=1 from ``tmp_path`` (not the repository), its SETUP a command that leaves a file."""
    settings = {"DRY_RUN": "1", "NODES": "n1", "SETUP": f"touch {tmp_path / 'setup-ran'}", **env}
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
    assert "# Ray: token authentication, a token made for this job: sha256 " in out
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
    assert "# Ray: token authentication, a token made for this job: sha256 " in made.stdout
    own = dry_run(tmp_path, RECIPE="grace_dapo.sh", RAY_AUTH_TOKEN_PATH="/shared/ray-token")
    assert "# Ray: RAY_AUTH_MODE=token (token: /shared/ray-token)" in own.stdout
    off = dry_run(tmp_path, RECIPE="grace_dapo.sh", RAY_AUTH_MODE="disabled")
    assert "# Ray: RAY_AUTH_MODE=disabled" in off.stdout


@pytest.mark.parametrize(
    "variable",
    ["RAY_START_TIMEOUT", "RETRIEVAL_START_TIMEOUT", "CHECK_INTERVAL", "CHECK_TIMEOUT", "STOP_TIMEOUT", "LOG_DIR"],
)
def test_wait_settings_are_documented(variable):
    assert f"`{variable}`" in (REPO / "recipes" / "slurm" / "README.md").read_text()


def test_job_that_would_serve_the_demo_corpus_refuses_before_starting_ray(tmp_path):
    result, _ = run_job(tmp_path, ray="up", server="up", SERVER_ARGS="")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "would serve the bundled demo corpus" in result.stderr
    assert 'SERVER_ARGS="--index-dir' in result.stderr and "RETRIEVAL_URL=" in result.stderr
    assert "ray start" not in result.stdout and "trainer ran" not in result.stdout


def test_job_asked_for_the_demo_corpus_or_given_a_server_runs(tmp_path):
    allowed, _ = run_job(tmp_path / "allowed", ray="up", server="up", SERVER_ARGS="", ALLOW_DEMO_CORPUS="1")
    assert allowed.returncode == 0 and "trainer ran" in allowed.stdout, allowed.stdout + allowed.stderr
    given, _ = run_job(tmp_path / "given", ray="up", server="up", SERVER_ARGS="", RETRIEVAL_URL="http://10.1.2.3:8123")
    assert given.returncode == 0, given.stdout + given.stderr
    assert "verl-evidence serve" not in given.stdout  # the user's own server: none started
    assert "RETRIEVAL_URL=http://10.1.2.3:8123 " in given.stdout


def fingerprint(token: str) -> str:
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()[:12]


def test_the_job_makes_a_token_that_reaches_the_server_every_ray_node_and_the_trainer(tmp_path):
    result, _ = run_job(tmp_path, ray="up", server="up")
    assert result.returncode == 0, result.stdout + result.stderr
    state = tmp_path / "state"
    server = (state / "server-token").read_text().strip()
    assert server != fingerprint("none")  # the server got a token
    assert (state / "ray-token").read_text().split() == [server, server]  # both nodes' Ray workers inherit it
    assert f"trainer token: {server}" in result.stdout
    assert f"# retrieval token of the server: sha256 {server}" in result.stdout
    again, _ = run_job(tmp_path / "again", ray="up", server="up")
    assert (tmp_path / "again" / "state" / "server-token").read_text().strip() != server  # one per job


def test_a_users_token_is_used_as_given(tmp_path):
    result, _ = run_job(tmp_path, ray="up", server="up", RETRIEVAL_SERVER_TOKEN="s3cret-of-the-user")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "state" / "server-token").read_text().strip() == fingerprint("s3cret-of-the-user")
    assert f"trainer token: {fingerprint('s3cret-of-the-user')}" in result.stdout
    assert "s3cret-of-the-user" not in result.stdout + result.stderr


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
    assert f"# retrieval token of the server: sha256 {fingerprint('tok-123456')}" in out
    assert f"# retrieval token of the search clients: sha256 {fingerprint('tok-123456')}" in out
    assert "tok-123456" not in out + result.stderr
    env.pop("RETRIEVAL_SERVER_TOKEN")
    made = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    server = made.stdout.split("# retrieval token of the server: sha256 ")[1].split()[0]
    clients = made.stdout.split("# retrieval token of the search clients: sha256 ")[1].split()[0]
    assert server == clients and len(server) == 12


def test_a_dedicated_server_node_stays_out_of_the_training_cluster(tmp_path):
    """RETRIEVAL_NODE=last: the server runs on that node with a Ray of its own; Ray and the trainer use the rest."""
    result, _ = run_job(tmp_path, ray="up", server="up", NODES="node1 node2 node3", RETRIEVAL_NODE="last")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "# retrieval server on its own node: node3" in out
    server_step = "-w node3 env -u RAY_ADDRESS bash -c true && exec verl-evidence serve --host 0.0.0.0"
    assert server_step in out
    assert "ray_node.sh" not in "".join(line for line in out.splitlines() if "-w node3" in line)
    assert out.count("ray_node.sh") == 2 and out.count(" --head --node-ip") == 1  # the head and node2 only
    server = (tmp_path / "state" / "server-env").read_text()
    assert server.startswith("RAY_ADDRESS=unset") and "--address" not in server
    assert "NNODES=2 " in out


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
