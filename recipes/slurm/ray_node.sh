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
#
# A node whose start-up fails is started again: `ray start` gives the node's raylet a fixed 30 s to register with the
# GCS and exits 1 past it ("The current node timed out during startup"), which happens when many nodes join at once
# or a node is busy. Up to RAY_NODE_START_ATTEMPTS (3) starts, when `ray start` exits non-zero within
# RAY_NODE_RETRY_WITHIN_S (120) of its start and no signal came; a node that ran longer than that and died is not
# restarted (the job fails as before). Each `ray start` runs in a process group of its own (setsid), so that what a
# failed start left running (its raylet, agents) is stopped before the next one.
attempts="${RAY_NODE_START_ATTEMPTS:-3}"
retry_within_s="${RAY_NODE_RETRY_WITHIN_S:-120}"
signalled=0
ray_pid=""
# srun passes a signal to this process only: on to Ray (whose `ray start` stops the node's Ray processes), then on
# to the clean-up below once it has exited.
trap 'signalled=1; [ -n "$ray_pid" ] && kill -TERM "$ray_pid" 2>/dev/null' TERM INT HUP
for ((attempt = 1; ; attempt++)); do
  started=$SECONDS
  setsid ray start "$@" --block &
  ray_pid=$!
  status=0
  wait "$ray_pid" || status=$?
  while kill -0 "$ray_pid" 2>/dev/null; do wait "$ray_pid" || status=$?; done  # a trap interrupted the first wait
  ran_s=$((SECONDS - started))
  if [ "$status" = 0 ] || [ "$signalled" = 1 ]; then break; fi
  # What the failed start left running (its raylet, agents) stops: a late raylet would join as a second node.
  kill -TERM -- "-$ray_pid" 2>/dev/null
  sleep "${RAY_NODE_RETRY_PAUSE_S:-5}"
  kill -KILL -- "-$ray_pid" 2>/dev/null
  if [ "$attempt" -ge "$attempts" ] || [ "$ran_s" -ge "$retry_within_s" ]; then break; fi
  echo "ray_node.sh: \`ray start\` exited with status $status after ${ran_s} s, at start-up: starting the node" \
    "again (attempt $((attempt + 1)) of $attempts)" >&2
done
address_file="${RAY_TMPDIR:-${TMPDIR:-/tmp}}/ray/ray_current_cluster"
if [[ "$(cat "$address_file" 2>/dev/null)" == *":$port" ]]; then rm -f "$address_file"; fi
exit "$status"
