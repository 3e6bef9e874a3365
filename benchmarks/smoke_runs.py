"""Wall time of every recipe's ``--smoke`` run (verl's trainer on CPU, 2 GRPO steps) against the 90 s budget.

Each recipe runs as a user runs it (``bash recipes/<name>.sh --smoke``), after one
``verl-evidence smoke prepare`` per method so the one-off warm-up is not counted
(it is timed separately). verl's file logger (``VERL_FILE_LOGGER_PATH``, one file per
run) is read as the run goes: the time each step's metrics appear splits a run into
start-up (command to verl's first step), the steps, and shut-down.

    python benchmarks/smoke_runs.py [--only eviomni_grpo ...] [--repeats N] [--json-out FILE]

Single runs of one recipe vary by several seconds on a 2-core machine, so with
``--repeats N`` the recipes run round-robin N times and the table shows each
recipe's median run (by wall time), which is what is held against the budget.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from verl_evidence.local.smoke.logs import MetricsTail, read_metrics  # noqa: E402

BUDGET_S = 90.0
# verl's metrics of the last step (its file logger): the learning signal each GRPO run must show (docs/debug-on-cpu.md)
SIGNAL = (
    "critic/score/min",
    "critic/score/max",
    "critic/advantages/min",
    "critic/advantages/max",
    "actor/grad_norm",
    "training/rollout_probs_diff_mean",
)
# name: (script, extra arguments, smoke method)
RUNS = {
    "eviomni_grpo": ("eviomni_grpo.sh", [], "eviomni"),
    "lear_grpo": ("lear_grpo.sh", [], "lear"),
    "composite": ("evinote_grpo.sh", ["reward_preset=composite"], "evinote"),
    "evinote_grpo": ("evinote_grpo.sh", [], "evinote"),
    "search_r1_baseline": ("search_r1_baseline.sh", [], "search_r1"),
    "grace_dapo": ("grace_dapo.sh", [], "grace"),
    "evipath_sft": ("evipath_sft.sh", [], "evipath_sft"),
}


def prepare(method: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "verl_evidence.cli", "smoke", "prepare", method],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    return time.perf_counter() - started


def timed_run(script: str, args: list[str]) -> dict:
    """Run one recipe; the seconds at which each step's metrics appeared in verl's file logger, and the wall time."""
    metrics_file = Path(tempfile.mkdtemp(prefix="smoke-metrics-")) / "metrics.jsonl"
    env = dict(os.environ, PYTHON=sys.executable, VERL_FILE_LOGGER_PATH=str(metrics_file))
    tail = MetricsTail(metrics_file)
    started = time.perf_counter()
    step_times: dict[int, float] = {}
    trainer_started = None
    lines = []
    with subprocess.Popen(
        ["bash", str(REPO / "recipes" / script), "--smoke", *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as process:  # fmt: skip
        for line in process.stdout:  # verl prints "step:N ..." as it logs the step: a cue to look at the file
            lines.append(line)
            if trainer_started is None and line.startswith("# trainer:"):  # after smoke prepare (and the search server)
                trainer_started = time.perf_counter() - started
            for step in tail.new_steps():
                step_times.setdefault(step, time.perf_counter() - started)
        code = process.wait()
    for step in tail.new_steps():  # logged after verl's last console line
        step_times.setdefault(step, time.perf_counter() - started)
    wall = time.perf_counter() - started
    output = "".join(lines)
    metrics = read_metrics(metrics_file) if metrics_file.exists() else {}
    return {
        "returncode": code,
        "wall_s": wall,
        "trainer_command_s": trainer_started,
        "step_seen_s": step_times,
        "step_s": {step: m.get("timing_s/step") for step, m in metrics.items()},
        "last_step": {key: metrics[max(metrics)].get(key) for key in SIGNAL} if metrics else {},
        "tail": output[-3000:] if code else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="these runs only")
    parser.add_argument("--repeats", type=int, default=1, help="runs per recipe, round-robin; the median counts")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    names = args.only or list(RUNS)

    print(f"load average at start: {[round(x, 2) for x in os.getloadavg()]}", flush=True)
    report = {"budget_s": BUDGET_S, "prepare_s": {}, "runs": {}}
    for name in names:
        method = RUNS[name][2]
        if method not in report["prepare_s"]:
            report["prepare_s"][method] = prepare(method)
    all_runs: dict[str, list[dict]] = {name: [] for name in names}
    for _ in range(max(1, args.repeats)):
        for name in names:
            script, extra, _ = RUNS[name]
            row = timed_run(script, extra)
            all_runs[name].append(row)
            print(json.dumps({"run": name, **{k: v for k, v in row.items() if k != "tail"}}), flush=True)
            if row["returncode"]:
                print(row["tail"], file=sys.stderr)
    for name, rows in all_runs.items():
        failed_rows = [row for row in rows if row["returncode"]]
        # a failed run is what the table shows, else the median run by wall time
        by_wall = sorted(rows, key=lambda r: r["wall_s"])
        report["runs"][name] = failed_rows[0] if failed_rows else by_wall[len(rows) // 2]
    report["wall_s_all"] = {name: [round(row["wall_s"], 1) for row in rows] for name, rows in all_runs.items()}

    print(
        "\nsmoke prepare (cached after the first run on a machine), s:",
        json.dumps({k: round(v, 1) for k, v in report["prepare_s"].items()}),
    )
    print(
        f"\n{'run':20} {'wall s':>7} {'to command s':>12} {'start-up s':>10} {'step 1 s':>8} {'step 2 s':>8}"
        f" {'shut-down s':>11} {'wall/budget':>11}"
    )
    failed = []
    for name, row in report["runs"].items():
        seen = row["step_seen_s"]
        first, last = (seen[min(seen)], seen[max(seen)]) if seen else (float("nan"), float("nan"))
        step1 = row["step_s"].get(1) or float("nan")
        step2 = row["step_s"].get(2) or float("nan")
        startup = first - step1 if seen else float("nan")
        ratio = row["wall_s"] / BUDGET_S
        to_command = row["trainer_command_s"] if row["trainer_command_s"] is not None else float("nan")
        print(
            f"{name:20} {row['wall_s']:7.1f} {to_command:12.1f} {startup:10.1f} {step1:8.1f} {step2:8.1f}"
            f" {row['wall_s'] - last:11.1f} {ratio:10.2f}x"
        )
        if row["returncode"] or ratio > 1:
            failed.append(name)
    print(
        f"\nlast step's learning signal (GRPO runs): {'score min/max':>15} {'advantage min/max':>19}"
        f" {'grad_norm':>9} {'probs diff':>10}"
    )
    for name, row in report["runs"].items():
        m = row["last_step"]
        if m.get("critic/advantages/max") is None:
            continue
        print(
            f"  {name:20} {m['critic/score/min']:7.3f}/{m['critic/score/max']:<7.3f}"
            f" {m['critic/advantages/min']:9.3f}/{m['critic/advantages/max']:<9.3f}"
            f" {m['actor/grad_norm']:9.3f} {m['training/rollout_probs_diff_mean']:10.1e}"
        )
    if args.repeats > 1:
        print(f"\nwall s of every run (median shown above): {json.dumps(report['wall_s_all'])}")
    print(
        f"\nwithin the {BUDGET_S:.0f} s budget: {len(report['runs']) - len(failed)}/{len(report['runs'])}"
        + (f" (over or failed: {', '.join(failed)})" if failed else "")
    )
    print(f"load average at end: {[round(x, 2) for x in os.getloadavg()]}")
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
