#!/usr/bin/env bash
# LEAR (seed 001): the earlier EviOmni formulation; same trainer settings, reward variant=lear.
# Assumes 1 node x 4 GPUs of 40 GB for Qwen2.5-1.5B (MODEL=qwen2.5-7b: 8 x 80 GB). See docs/recipes.md.
set -euo pipefail
export MODEL="${MODEL:-qwen2.5-1.5b}"
export GPUS_PER_NODE="${GPUS_PER_NODE:-4}" VARIANT="${VARIANT:-lear}" PRESET="${PRESET:-lear_grpo}"
export TRAIN_FILES="${TRAIN_FILES:-data/lear/train.parquet}" VAL_FILES="${VAL_FILES:-data/lear/test.parquet}"
export EXPERIMENT="${EXPERIMENT:-lear-grpo-$MODEL}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/eviomni_grpo.sh" "$@"
