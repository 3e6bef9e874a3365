#!/usr/bin/env bash
# One Ray node of recipes/slurm/train.sbatch, run on its node by an srun step: `ray_node.sh <port> <ray start
# options>` runs `ray start <options> --block` until the step is signalled (scancel, preemption, or the job script
# ending its steps), then removes the node's Ray address file.
#
# Every `ray start` writes <Ray temp dir>/ray_current_cluster (RAY_TMPDIR, TMPDIR or /tmp, then ray/), and a `ray
# start --block` stopped by a signal leaves it behind: a plain ray.init() on this node afterwards (another job, a
# retrieval server on a Ray of its own) would try to join this job's stopped cluster. The file is removed only while
# it still names this job's Ray port (another Ray on a shared node may have written it since).
set -uo pipefail
port="${1:?usage: ray_node.sh <ray port> <ray start options...>}"
shift
ray start "$@" --block &
ray_pid=$!
# srun passes a signal to this process only: on to Ray (whose `ray start` stops the node's Ray processes), then on
# to the clean-up below once it has exited.
trap 'kill -TERM "$ray_pid" 2>/dev/null' TERM INT HUP
status=0
wait "$ray_pid" || status=$?
while kill -0 "$ray_pid" 2>/dev/null; do wait "$ray_pid" || status=$?; done  # a trap interrupted the first wait
address_file="${RAY_TMPDIR:-${TMPDIR:-/tmp}}/ray/ray_current_cluster"
if [[ "$(cat "$address_file" 2>/dev/null)" == *":$port" ]]; then rm -f "$address_file"; fi
exit "$status"
