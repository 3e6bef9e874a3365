#!/usr/bin/env bash
# The retrieval server on a node of its own (RETRIEVAL_NODE of recipes/slurm/train.sbatch), run there by an srun
# step: `server_node.sh <verl-evidence serve options>`. The server starts a Ray instance of its own on the node, outside
# the training cluster (no RAY_ADDRESS). Left to itself, that Ray would advertise the machine's CPUs and GPUs, not
# those srun gave the step: a replica asking for more than the machine's count would never be placed, one asking for
# less might take CPUs of another job. So it advertises the step's (Ray's RAY_OVERRIDE_RESOURCES, read when a node
# starts, which is what `ray start --num-cpus/--num-gpus` set).
set -euo pipefail
cpus="${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-}}"
gpus="${SLURM_GPUS_ON_NODE:-0}"
if [ -z "$cpus" ]; then
  echo "server_node.sh: neither SLURM_CPUS_PER_TASK nor SLURM_CPUS_ON_NODE is set: run it as an srun step" >&2
  exit 2
fi
export RAY_OVERRIDE_RESOURCES="{\"CPU\": $cpus, \"GPU\": $gpus}"
echo "server_node.sh: this node's Ray advertises what srun gave the step: $RAY_OVERRIDE_RESOURCES"
unset RAY_ADDRESS
exec verl-evidence serve "$@"
