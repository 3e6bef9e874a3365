#!/usr/bin/env bash
# EviOmni / LEAR (seeds 000, 001): the QA generator that answers from the extracted evidence in the papers'
# evaluation (`verl-evidence eval --reader`): Qwen2.5 fine-tuned with LoRA to predict the gold answer from the question
# and its retrieved passages (READER_PROMPT=eviomni_closed_book: from the question alone, the Zero baseline), with
# verl's SFT trainer (verl.trainer.sft_trainer). `eval --reader CHECKPOINT_DIR/global_step_N` takes its checkpoint.
# Data: EviOmni rows (`verl-evidence data eviomni ...`, SOURCE_ROWS) turned into chat rows (q, P) -> a by
# verl_evidence.eval.paper_reader_data, written to TRAIN_FILES first if it does not exist. No retrieval server.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
ve_parse_args "$@"
READER_PROMPT="${READER_PROMPT:-eviomni_reader}"
SOURCE=(--rows "${SOURCE_ROWS:-data/eviomni/train.parquet}")
if [ "$SMOKE" = 1 ]; then  # the bundled questions with their BM25 top 5 and the smoke runs' tiny base policy
  SOURCE=(--bundled)
  TRAIN_FILES="${TRAIN_FILES:-${TMPDIR:-/tmp}/verl-evidence-smoke/eviomni_reader/train.parquet}"
  EXPERIMENT="${EXPERIMENT:-smoke-eviomni_reader}"  # (not the EviPath smoke run's name and directory)
  CHECKPOINT_DIR="${CHECKPOINT_DIR:-${TMPDIR:-/tmp}/verl-evidence-smoke/eviomni_reader}"
  MAX_LENGTH="${MAX_LENGTH:-2560}"  # the tiny tokenizer spends up to ~2040 tokens on a prompt with 5 passages
fi
ve_smoke evipath_sft  # (the CPU settings of verl's SFT trainer, shared with the EviPath SFT recipe)

MODEL="${MODEL:-qwen2.5-1.5b}"; ve_model_preset
NNODES="${NNODES:-1}"; GPUS_PER_NODE="${GPUS_PER_NODE:-1}"
TRAIN_FILES="${TRAIN_FILES:-data/eviomni_reader/train.parquet}"; VAL_FILES="${VAL_FILES:-null}"
EXPERIMENT="${EXPERIMENT:-eviomni-reader-sft-$MODEL}"
# Sources: the papers' values name where they state them (EviOmni App. A.2; LEAR §4.1 the same; checked by
# tests/recipes/test_paper_tags.py); [ours] the papers do not give it, the reason follows.
LORA_RANK="${LORA_RANK:-8}"                    # [paper: EviOmni A.2] LoRA rank of the QA generators
LORA_ALPHA="${LORA_ALPHA:-16}"                 # [ours] verl's default alpha (2 x rank)
TARGET_MODULES="${TARGET_MODULES:-all-linear}" # [ours] every linear layer, verl's default
LR="${LR:-1e-4}"                               # [ours] a usual LoRA rate (full fine-tuning rates are ~100x smaller)
EPOCHS="${EPOCHS:-1}"; WARMUP_RATIO="${WARMUP_RATIO:-0.05}"     # [ours] one pass over NQ's train set
MICRO_BATCH="${MICRO_BATCH:-4}"; GRAD_ACCUM="${GRAD_ACCUM:-8}" # [ours]
BATCH="${BATCH:-$((MICRO_BATCH * GRAD_ACCUM * GPUS_PER_NODE * NNODES))}"
MAX_LENGTH="${MAX_LENGTH:-2048}"               # [ours] the prompt with 5 passages of ~100 words, and a short answer
CHECKPOINT_DIR="${CHECKPOINT_DIR:-checkpoints/${PROJECT:-verl-evidence}/$EXPERIMENT}"

data_cmd=("$VE_PYTHON" -m verl_evidence.eval.paper_reader_data "${SOURCE[@]}" --out "$TRAIN_FILES" --prompt "$READER_PROMPT")
cmd=("$VE_PYTHON" -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node="$GPUS_PER_NODE"
  -m verl.trainer.sft_trainer
  model.path="$MODEL_PATH" model.lora_rank="$LORA_RANK" model.lora_alpha="$LORA_ALPHA"
  model.target_modules="$TARGET_MODULES"
  data.train_files="$TRAIN_FILES" data.val_files="$VAL_FILES" data.messages_key=messages
  data.train_batch_size="$BATCH" data.micro_batch_size_per_gpu="$MICRO_BATCH"
  data.max_length="$MAX_LENGTH" data.truncation=error data.pad_mode=no_padding  # error: verl would cut the answer off
  optim.lr="$LR" optim.lr_warmup_steps_ratio="$WARMUP_RATIO"
  trainer.total_epochs="$EPOCHS" trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$GPUS_PER_NODE"
  trainer.project_name="${PROJECT:-verl-evidence}" trainer.experiment_name="$EXPERIMENT"
  trainer.default_local_dir="$CHECKPOINT_DIR" trainer.logger="${LOGGER:-[console]}"
  trainer.save_freq="${SAVE_FREQ:-after_each_epoch}" trainer.test_freq="${TEST_FREQ:--1}"
  "${SMOKE_ARGS[@]}" "${EXTRA_ARGS[@]}")

echo "# reader data (written unless $TRAIN_FILES exists):"
ve_print "${data_cmd[@]}"
echo "# trainer:"
ve_print "${cmd[@]}"
if [ "$DRY_RUN" = 1 ]; then exit 0; fi
ve_need_python
if [ ! -f "$TRAIN_FILES" ]; then "${data_cmd[@]}"; fi
"${cmd[@]}"
