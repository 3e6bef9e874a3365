#!/usr/bin/env bash
# LEAR (seed 001): the earlier EviOmni formulation; same trainer settings, reward variant=lear.
# Assumes 1 node x 4 GPUs of 40 GB for Qwen2.5-1.5B (MODEL=qwen2.5-7b: 8 x 80 GB). See docs/recipes.md.
set -euo pipefail
export VARIANT="${VARIANT:-lear}" PRESET="${PRESET:-lear_grpo}"
# LEAR's defaults, taken by eviomni_grpo.sh where neither the user nor --smoke set a value
export RECIPE_MODEL=qwen2.5-1.5b RECIPE_GPUS_PER_NODE=4 RECIPE_DATA=data/lear RECIPE_NAME=lear-grpo
exec bash "$(dirname "${BASH_SOURCE[0]}")/eviomni_grpo.sh" "$@"
