#!/usr/bin/env bash
# EviPath (seed 003): supervised fine-tuning on synthesised planner/executor trajectories
# with verl's SFT trainer (verl.trainer.sft_trainer, Hydra config sft_trainer_engine).
# Paper (Table 7): lr 2e-6, per-device batch 2, gradient accumulation 8, 2 epochs, warmup 0.1,
# full fine-tuning on 4 x 80 GB. One model on planner + executor data (the paper's better setup).
# Data: `verl-evidence evipath synthesize --out data/evipath ...` writes data/evipath/train.parquet.
# Unlike the RL recipes there is no retrieval server: the observations are in the data.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
ve_parse_args "$@"
ve_smoke evipath_sft

MODEL="${MODEL:-llama3.1-8b}"; ve_model_preset
NNODES="${NNODES:-1}"; GPUS_PER_NODE="${GPUS_PER_NODE:-4}"
TRAIN_FILES="${TRAIN_FILES:-data/evipath/train.parquet}"; VAL_FILES="${VAL_FILES:-null}"
EXPERIMENT="${EXPERIMENT:-evipath-sft-$MODEL}"
LR="${LR:-2e-6}"; WARMUP_RATIO="${WARMUP_RATIO:-0.1}"; LR_SCHEDULER="${LR_SCHEDULER:-cosine}"
WEIGHT_DECAY="${WEIGHT_DECAY:-0.0}"; GRAD_CLIP="${GRAD_CLIP:-1.0}"; EPOCHS="${EPOCHS:-2}"
MICRO_BATCH="${MICRO_BATCH:-2}"; GRAD_ACCUM="${GRAD_ACCUM:-8}"
# Global batch = per-device batch x accumulation x data-parallel ranks (64 on 4 GPUs).
BATCH="${BATCH:-$((MICRO_BATCH * GRAD_ACCUM * GPUS_PER_NODE * NNODES))}"
MAX_LENGTH="${MAX_LENGTH:-8192}"; TRUNCATION="${TRUNCATION:-right}"
DYNAMIC_BSZ="${DYNAMIC_BSZ:-false}"; MAX_TOKENS_PER_GPU="${MAX_TOKENS_PER_GPU:-16384}"
CHECKPOINT_DIR="${CHECKPOINT_DIR:-checkpoints/${PROJECT:-verl-evidence}/$EXPERIMENT}"

if [ "$NNODES" -gt 1 ]; then
  LAUNCH=(torchrun --nnodes="$NNODES" --nproc_per_node="$GPUS_PER_NODE" --node_rank="${NODE_RANK:?set NODE_RANK}"
    --master_addr="${MASTER_ADDR:?set MASTER_ADDR}" --master_port="${MASTER_PORT:-29500}")
else
  LAUNCH=("$VE_PYTHON" -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node="$GPUS_PER_NODE")
fi

cmd=("${LAUNCH[@]}" -m verl.trainer.sft_trainer
  model.path="$MODEL_PATH" model.enable_gradient_checkpointing=true
  data.train_files="$TRAIN_FILES" data.val_files="$VAL_FILES" data.messages_key=messages
  data.train_batch_size="$BATCH" data.micro_batch_size_per_gpu="$MICRO_BATCH"
  data.use_dynamic_bsz="$DYNAMIC_BSZ" data.max_token_len_per_gpu="$MAX_TOKENS_PER_GPU"
  data.max_length="$MAX_LENGTH" data.truncation="$TRUNCATION" data.pad_mode=no_padding
  optim.lr="$LR" optim.lr_warmup_steps_ratio="$WARMUP_RATIO" optim.lr_scheduler_type="$LR_SCHEDULER"
  optim.weight_decay="$WEIGHT_DECAY" optim.clip_grad="$GRAD_CLIP"
  engine.param_offload="${PARAM_OFFLOAD:-false}" engine.optimizer_offload="${OPTIMIZER_OFFLOAD:-false}"
  trainer.total_epochs="$EPOCHS" trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$GPUS_PER_NODE"
  trainer.project_name="${PROJECT:-verl-evidence}" trainer.experiment_name="$EXPERIMENT"
  trainer.default_local_dir="$CHECKPOINT_DIR" trainer.logger="${LOGGER:-[console]}"
  trainer.save_freq="${SAVE_FREQ:-after_each_epoch}" trainer.test_freq="${TEST_FREQ:--1}"
  "${SMOKE_ARGS[@]}" "${EXTRA_ARGS[@]}")

echo "# trainer:"
ve_print "${cmd[@]}"
if [ "$DRY_RUN" = 1 ]; then exit 0; fi
ve_need_python
"${cmd[@]}"
