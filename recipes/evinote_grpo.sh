#!/usr/bin/env bash
# EviNote-RAG (seed 002): multi-turn search with supportive-evidence notes; R = gate + EQR (NLI judge); GRPO.
# Assumes 1 node x 8 GPUs of 80 GB for Qwen2.5-7B; the NLI judge runs on CPU unless NLI_NUM_GPUS > 0
# (then leave it a GPU: e.g. a 2-node Slurm job). Starts the retrieval server first. See docs/recipes.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
ve_parse_args "$@"
ve_smoke evinote

MODEL="${MODEL:-qwen2.5-7b}"; ve_model_preset
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
TRAIN_FILES="${TRAIN_FILES:-data/evinote/train.parquet}"; VAL_FILES="${VAL_FILES:-data/evinote/test.parquet}"
# The paper's ablation rows (Tables 2-5; docs/methods/evinote.md): sen | naive_summary | naive_evidence |
# force_summary | force_summary_sr | force_summary_eqr. Empty: the method itself (SEN + EQR).
ABLATION="${ABLATION:-}"; ABLATION_ARGS=()
case "$ABLATION" in
  "") ;;
  sen) ABLATION_ARGS=(reward_preset=evinote_sen) ;;
  naive_summary|naive_evidence|force_summary)
    ABLATION_ARGS=(reward_preset="evinote_$ABLATION"); ROLLOUT_PRESET="${ROLLOUT_PRESET:-evinote_$ABLATION}" ;;
  force_summary_sr|force_summary_eqr)
    ABLATION_ARGS=(reward_preset="evinote_$ABLATION"); ROLLOUT_PRESET="${ROLLOUT_PRESET:-evinote_force_summary}" ;;
  *) echo "unknown ABLATION=$ABLATION: sen, naive_summary, naive_evidence, force_summary, force_summary_sr or" \
       "force_summary_eqr" >&2; exit 2 ;;
esac
EXPERIMENT="${EXPERIMENT:-evinote-grpo-$MODEL${ABLATION:+-$ABLATION}}"
# Sources: the paper's values name where it states them (checked by tests/recipes/test_paper_tags.py); [S-R1]
# Search-R1's released train_grpo.sh, which EviNote builds on; [ours] no paper gives it, the reason follows. search_r1_baseline.sh uses these same values so the two compare like for like.
LR="${LR:-1e-5}"                  # [paper: EviNote §4.4]
TEMPERATURE="${TEMPERATURE:-1.0}" # [paper: EviNote §4.4] sampling temperature of the rollouts
BATCH="${BATCH:-600}"             # [paper: EviNote §4.4] prompts per step
GROUP_SIZE="${GROUP_SIZE:-4}"     # [paper: EviNote §4.4] rollouts per prompt
MAX_SEARCHES="${MAX_SEARCHES:-5}" # [paper: EviNote §4.4] retrievals per question
KL_COEF="${KL_COEF:-0.001}"       # [S-R1] low_var_kl loss
TOPK="${TOPK:-3}"                 # [S-R1] passages per search
MINI_BATCH="${MINI_BATCH:-300}"   # [ours] two updates per step, as Search-R1's 512/256
CLIP="${CLIP:-0.2}"               # [ours] the standard PPO/GRPO epsilon (EviNote's Eq. 5 leaves it unset)
EPOCHS="${EPOCHS:-1}"             # [ours] one pass over NQ+HotpotQA train (~170k questions, ~280 steps)
PROMPT_LEN="${PROMPT_LEN:-1024}"  # [ours] instructions + question, longest bundled/NQ/HotpotQA prompt well under
RESPONSE_LEN="${RESPONSE_LEN:-4096}" # [ours] the whole trajectory: 5 searches x (query + 3 passages + note) + answer
NLI_MODEL="${NLI_MODEL:-typeform/distilbert-base-uncased-mnli}"; NLI_NUM_GPUS="${NLI_NUM_GPUS:-0}"

ve_retrieval_server
ve_common_overrides
ve_search_overrides
ve_run --config-path="$VE_PRESETS" --config-name="${PRESET:-evinote_grpo}" "${COMMON_ARGS[@]}" \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false \
  data.train_batch_size="$BATCH" data.max_prompt_length="$PROMPT_LEN" data.max_response_length="$RESPONSE_LEN" \
  actor_rollout_ref.actor.optim.lr="$LR" actor_rollout_ref.actor.ppo_mini_batch_size="$MINI_BATCH" \
  actor_rollout_ref.actor.clip_ratio="$CLIP" actor_rollout_ref.actor.use_kl_loss=true \
  actor_rollout_ref.actor.clip_ratio_low="$CLIP" actor_rollout_ref.actor.clip_ratio_high="$CLIP" \
  actor_rollout_ref.actor.kl_loss_coef="$KL_COEF" actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.rollout.n="$GROUP_SIZE" actor_rollout_ref.rollout.temperature="$TEMPERATURE" \
  "${SEARCH_ARGS[@]}" ${ABLATION_ARGS[@]+"${ABLATION_ARGS[@]}"} \
  ++reward.reward_kwargs.nli_model="$NLI_MODEL" ++reward.reward_kwargs.nli_num_gpus="$NLI_NUM_GPUS" \
  trainer.total_epochs="$EPOCHS"
