"""CPU-seconds of one recipe's ``--smoke`` run, per process of its tree (driver, Ray's own, each Ray actor).

Wall time on a shared 2-core machine says more about the neighbours than about the run;
the CPU the run's own processes used does not (it still grows ~15 % on a loaded machine:
caches). The run is ``bash recipes/<script> --smoke`` as a user runs it; every process
under it (verl's driver, Ray's GCS, raylet and agents, and each Ray worker, named by the
title Ray gives it: ``ray::WorkerDict``, ``ray::HFRolloutServer`` ...) is sampled from
/proc every 0.25 s with psutil, and the table shows its last-seen CPU time.

    python benchmarks/smoke_cpu.py grace_dapo.sh [hydra.key=value ...] [--json-out FILE]

Prepare the method's smoke data first (``verl-evidence smoke prepare <method>``), so the
one-off warm-up is not counted. A process that lives less than one sample is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.25


def process_name(process: psutil.Process) -> str:
    """Ray's title for its workers (``ray::WorkerDict.update_actor``: the actor, not the method), else the command."""
    command = process.cmdline()
    if command and command[0].startswith("ray::"):
        return command[0].strip().split(".")[0].split(":")[-1]
    if not command:
        return process.name()
    script = next((Path(part).name for part in command[1:] if part.endswith(".py")), "")
    module = command[command.index("-m") + 1] if "-m" in command[:-1] else ""
    return module or script or Path(command[0]).name


def measure(command: list[str], env: dict[str, str]) -> tuple[int, float, dict[int, dict]]:
    """Run ``command``; sample its whole process tree until it exits. Returns exit code, wall s, per-process CPU."""
    seen: dict[int, dict] = {}
    started = time.perf_counter()
    root = psutil.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    while True:
        for process in [root, *root.children(recursive=True)]:
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    name = process_name(process)
                    entry = seen.setdefault(process.pid, {"name": name, "cpu": 0.0})
                    if name != "IDLE":  # a Ray worker: setup_worker.py, then ray::IDLE, then ray::<its actor>
                        entry["name"] = name
                    entry["cpu"] = times.user + times.system
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
        if root.poll() is not None:
            return root.returncode, time.perf_counter() - started, seen
        time.sleep(SAMPLE_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", help="a recipe in recipes/, e.g. grace_dapo.sh")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides passed to the recipe")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="smoke-cpu-") as tmp:
        env = {
            **os.environ,
            "PYTHON": sys.executable,
            "CHECKPOINT_DIR": f"{tmp}/checkpoints",
            "VERL_FILE_LOGGER_PATH": f"{tmp}/metrics.jsonl",
        }
        command = ["bash", str(REPO / "recipes" / args.script), "--smoke", *args.overrides]
        code, wall, seen = measure(command, env)
    total = sum(entry["cpu"] for entry in seen.values())
    by_name: dict[str, list[float]] = {}
    for entry in seen.values():
        by_name.setdefault(entry["name"], []).append(entry["cpu"])
    print(f"{args.script} --smoke: exit {code}, wall {wall:.1f} s, CPU {total:.1f} s in {len(seen)} processes")
    print(f"{'CPU-s':>7}  {'n':>2}  process")
    for name, cpus in sorted(by_name.items(), key=lambda item: -sum(item[1])):
        print(f"{sum(cpus):7.1f}  {len(cpus):2d}  {name}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"exit": code, "wall_s": wall, "cpu_s": total, "processes": by_name}))
    sys.exit(code)


if __name__ == "__main__":
    main()
