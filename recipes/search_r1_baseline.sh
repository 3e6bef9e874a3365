#!/usr/bin/env bash
# Search-R1 baseline: multi-turn search, exact-match reward (verl_evidence.rewards.answer), GRPO.
# Assumes 1 node x 8 GPUs of 80 GB for Qwen2.5-7B (MODEL=qwen2.5-3b: 8 x 40 GB). Starts the retrieval server first.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
ve_parse_args "$@"
ve_smoke search_r1

MODEL="${MODEL:-qwen2.5-7b}"; ve_model_preset
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
TRAIN_FILES="${TRAIN_FILES:-data/search_r1/train.parquet}"; VAL_FILES="${VAL_FILES:-data/search_r1/test.parquet}"
EXPERIMENT="${EXPERIMENT:-search-r1-grpo-$MODEL}"
# The baseline EviNote-RAG compares against (§4.5) trained in EviNote's setup, so only the reward and the note differ:
# every default below is evinote_grpo.sh's, with its source (the EviNote paper's, naming where it states them;
# [S-R1] Search-R1's released train_grpo.sh; [ours] no paper gives it). Search-R1's own script differs: LR=1e-6 BATCH=512 MINI_BATCH=256
# GROUP_SIZE=5 RESPONSE_LEN=500 per turn; set those to reproduce Search-R1 itself.
LR="${LR:-1e-5}"                  # [paper: EviNote §4.4]
TEMPERATURE="${TEMPERATURE:-1.0}" # [paper: EviNote §4.4]
BATCH="${BATCH:-600}"             # [paper: EviNote §4.4] prompts per step
GROUP_SIZE="${GROUP_SIZE:-4}"     # [paper: EviNote §4.4] rollouts per prompt
MAX_SEARCHES="${MAX_SEARCHES:-5}" # [paper: EviNote §4.4] retrievals per question
KL_COEF="${KL_COEF:-0.001}"       # [S-R1] low_var_kl loss
TOPK="${TOPK:-3}"                 # [S-R1] passages per search
MINI_BATCH="${MINI_BATCH:-300}"   # [ours] two updates per step, as Search-R1's 512/256
CLIP="${CLIP:-0.2}"               # [ours] the standard PPO/GRPO epsilon (neither paper states one)
EPOCHS="${EPOCHS:-1}"             # [ours] one pass over NQ+HotpotQA train, as evinote_grpo.sh
PROMPT_LEN="${PROMPT_LEN:-1024}"  # [ours] instructions + question, as evinote_grpo.sh
RESPONSE_LEN="${RESPONSE_LEN:-4096}" # [ours] the whole trajectory, as evinote_grpo.sh

ve_retrieval_server
ve_common_overrides
ve_search_overrides
ve_run --config-path="$VE_PRESETS" --config-name="${PRESET:-search_r1_baseline}" "${COMMON_ARGS[@]}" \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false \
  data.train_batch_size="$BATCH" data.max_prompt_length="$PROMPT_LEN" data.max_response_length="$RESPONSE_LEN" \
  actor_rollout_ref.actor.optim.lr="$LR" actor_rollout_ref.actor.ppo_mini_batch_size="$MINI_BATCH" \
  actor_rollout_ref.actor.clip_ratio="$CLIP" actor_rollout_ref.actor.use_kl_loss=true \
  actor_rollout_ref.actor.clip_ratio_low="$CLIP" actor_rollout_ref.actor.clip_ratio_high="$CLIP" \
  actor_rollout_ref.actor.kl_loss_coef="$KL_COEF" actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.rollout.n="$GROUP_SIZE" actor_rollout_ref.rollout.temperature="$TEMPERATURE" \
  "${SEARCH_ARGS[@]}" \
  trainer.total_epochs="$EPOCHS"
