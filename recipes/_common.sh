# shellcheck shell=bash
# Shared by the recipes: argument parsing, model presets, the retrieval server,
# and printing/running the one trainer command. Source it; do not run it.
#
# Every recipe variable can be set from the environment (VAR=value bash recipe.sh);
# arguments other than the flags below are passed to Hydra unchanged.

VE_RECIPES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # used by the recipes that source this file
VE_PRESETS="$VE_RECIPES/presets"
# The interpreter: PYTHON, else this repository's .venv, else a python3 that imports the project (recipes/_python.sh)
# shellcheck source-path=SCRIPTDIR source=_python.sh
source "$VE_RECIPES/_python.sh"
ve_find_python "$(dirname "$VE_RECIPES")"
# `verl-evidence serve` lives beside the interpreter (a venv need not be activated)
if [ -n "$VE_PYTHON" ] && [ -x "$(dirname "$(command -v "$VE_PYTHON")")/verl-evidence" ]; then
  case ":$PATH:" in *":$(dirname "$(command -v "$VE_PYTHON")"):"*) ;; *) PATH="$(dirname "$(command -v "$VE_PYTHON")"):$PATH" ;; esac
fi
VE_PYTHON="${VE_PYTHON:-python3}"  # printed in a --dry-run; anything that runs it calls ve_need_python first
DRY_RUN=0
SMOKE=0
SMOKE_ARGS=()  # the CPU training mode's overrides (--smoke); before EXTRA_ARGS so the user's still win
EXTRA_ARGS=()
HYDRA_FLAGS=()  # Hydra's own flags go before every override (its argparse rejects them in between)

ve_usage() {
  cat <<EOF
usage: $(basename "$0") [--dry-run] [--smoke] [--no-server] [hydra.key=value ...]

  --dry-run     print the retrieval-server and trainer commands, run nothing
  --smoke       2 training steps on this machine's CPU (no GPU): a tiny warmed-up policy, bundled data,
                small batches; the same verl trainer and presets (docs/debug-on-cpu.md)
  --no-server   do not start a retrieval server (use RETRIEVAL_URL as is)
  --cfg job [--resolve]   Hydra: print the composed trainer config instead of training (CPU is enough)
  key=value     extra Hydra overrides, appended last (they win)

Environment: MODEL (qwen2.5-1.5b|qwen2.5-3b|qwen2.5-7b|qwen3-4b|qwen3-8b|llama3.2-3b|llama3.1-8b),
MODEL_PATH, NNODES, GPUS_PER_NODE, TP, TRAIN_FILES, VAL_FILES, CHECKPOINT_DIR, RESUME_MODE (auto: continue from
the last checkpoint in CHECKPOINT_DIR), RETRIEVAL_URL, START_SERVER,
SERVER_ARGS, SERVER_WAIT (600 s), SERVER_FIRST (1: start the trainer only once the server answers),
ALLOW_DEMO_CORPUS (1: train on the bundled demo corpus when neither RETRIEVAL_URL nor SERVER_ARGS="--index-dir ..."
names an index), MASK_CHECK (false: log the per-step masking shares without stopping on a trained retrieved
token; docs/training-metrics.md) and every hyperparameter named at the top of the recipe. See docs/recipes.md.
EOF
}

ve_parse_args() {
  START_SERVER="${START_SERVER:-auto}"
  while [ $# -gt 0 ]; do
    case "$1" in
      --dry-run) DRY_RUN=1 ;;
      --smoke) SMOKE=1 ;;
      --no-server) START_SERVER=0 ;;
      -h|--help) ve_usage; exit 0 ;;
      --cfg|--package) HYDRA_FLAGS+=("$1" "${2:?$1 needs a value}"); shift ;;  # Hydra: print the config, do not train
      --resolve) HYDRA_FLAGS+=("$1") ;;
      --*) echo "unknown flag $1 (Hydra overrides are key=value)" >&2; ve_usage >&2; exit 2 ;;
      *)
        # LR=5e-5 here is a recipe variable, not a Hydra override: Hydra refuses it, and +LR=5e-5 would add a key
        # nothing reads (the run would train at the default rate without a word)
        if [[ "$1" =~ ^\+{0,2}([A-Z][A-Z0-9_]*=.*)$ ]]; then
          echo "error: $1 is a recipe variable, not a Hydra override: set it before the command," \
            "e.g. ${BASH_REMATCH[1]} bash $0 ..." >&2
          exit 2
        fi
        EXTRA_ARGS+=("$1") ;;
    esac
    shift
  done
}

# --smoke: debug the recipe on CPU (verl_evidence.local.cpu_mode): same presets and trainer, tiny warmed-up policy,
# data prepared from the bundled set, 2 steps. Only fills variables the user has not set. Call it right after
# ve_parse_args with the method name (eviomni|lear|evinote|search_r1|grace|evipath_sft).
ve_smoke() {
  [ "$SMOKE" = 1 ] || return 0
  local method="$1" prepared
  export VERL_PLATFORM=cpu HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
  export TOKENIZERS_PARALLELISM=false
  # No idle Ray workers started ahead of need: verl's actors run in runtime-env workers of their own, so the idle ones
  # only cost start-up CPU (~7 CPU-s of a ~100 CPU-s smoke run on 2 cores, measured).
  export RAY_prestart_worker_first_driver="${RAY_prestart_worker_first_driver:-0}"
  ve_need_python
  echo "# smoke run on CPU: preparing the tiny policy and the $method data (cached after the first run)" >&2
  prepared="$("$VE_PYTHON" -m verl_evidence.local.smoke prepare "$method")" || exit 1
  local name value
  while IFS='=' read -r name value; do
    [ -n "$name" ] || continue
    if [ -z "${!name:-}" ]; then eval "$name=$value"; export "${name?}"; fi
  done <<< "$prepared"
  : "${MODEL:=smoke}" "${TP:=1}" "${NNODES:=1}" "${GPUS_PER_NODE:=1}" "${ROLLOUT_ENGINE:=hf}"
  : "${BATCH:=2}" "${MINI_BATCH:=2}" "${GROUP_SIZE:=8}" "${EPOCHS:=1}" "${STEPS:=${SMOKE_STEPS:-2}}" "${WARMUP_STEPS:=0}"
  : "${PROMPT_LEN:=1024}" "${RESPONSE_LEN:=160}" "${OVERLONG_LEN:=32}" "${MAX_SEARCHES:=1}" "${TOPK:=1}"
  # Small packs: without flash-attention's varlen kernels, sdpa masks a packed micro-batch as one sequence, so its
  # attention costs the square of the pack (measured, EviOmni step 2: log-prob + update 20.3 s at 8192, 6.6 s at 2048).
  : "${MAX_TOKENS_PER_GPU:=2048}" "${VAL_BEFORE_TRAIN:=false}" "${TEST_FREQ:=-1}" "${SAVE_FREQ:=-1}"
  : "${MICRO_BATCH:=2}" "${GRAD_ACCUM:=1}" "${MAX_LENGTH:=1536}" "${LOGGER:=[console,file]}"
  # A learning rate large enough that one update visibly moves the policy: step 2's rollout-vs-actor
  # log-prob gap then shows whether the rollout really generates from the synced weights.
  : "${LR:=1e-4}"
  : "${EXPERIMENT:=smoke-$method}" "${CHECKPOINT_DIR:=${TMPDIR:-/tmp}/verl-evidence-smoke/$method}"
  : "${RESUME_MODE:=disable}"  # a debug run starts fresh (RESUME_MODE=auto with SAVE_FREQ=1 tries resuming on CPU)
  # verl's file logger (trainer.logger=[console,file]): every step's metrics as JSONL, what the smoke runs' readers
  # read (verl_evidence.local.smoke.logs)
  : "${VERL_FILE_LOGGER_PATH:=$CHECKPOINT_DIR/metrics.jsonl}"
  export VERL_FILE_LOGGER_PATH
  mkdir -p "$(dirname "$VERL_FILE_LOGGER_PATH")"
  echo "# metrics (verl's file logger): $VERL_FILE_LOGGER_PATH" >&2
  : "${RETRIEVAL_PORT:=8000}"
  if [ "$method" = evipath_sft ]; then
    SMOKE_ARGS=(
      +model.override_config.attn_implementation=sdpa
      model.enable_gradient_checkpointing=false engine.strategy=fsdp2 engine.dtype=float32
      "++engine.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
      engine.use_torch_compile=false data.num_workers=0 trainer.device=cpu
      trainer.total_training_steps="${SMOKE_STEPS:-2}"
    )
    return 0
  fi
  # The trainer's own Ray instance: 16 logical CPUs and the policy's "GPU". A run that joins a running cluster
  # (RAY_ADDRESS: recipes/slurm/train.sbatch) takes the sizes its nodes' `ray start` gave (ray.init refuses them
  # then), and its Ray workers were started without this run's environment: the variables the CPU mode's workers
  # read go in the runtime environment instead.
  local ray_args=(+ray_kwargs.ray_init.num_gpus="$GPUS_PER_NODE" ray_kwargs.ray_init.num_cpus=16)
  if [ -n "${RAY_ADDRESS:-}" ]; then
    ray_args=()
    for name in VERL_PLATFORM HF_HUB_OFFLINE TRANSFORMERS_OFFLINE TOKENIZERS_PARALLELISM VERL_FILE_LOGGER_PATH; do
      ray_args+=("+ray_kwargs.ray_init.runtime_env.env_vars.$name='${!name}'")  # quoted: strings, as Ray wants
    done
  fi
  SMOKE_ARGS=(
    trainer.device=cpu "${ray_args[@]}"
    +ray_kwargs.ray_init.include_dashboard=false  # seconds of start-up and a process on a small machine
    transfer_queue.backend.SimpleStorage.num_data_storage_units=1
    actor_rollout_ref.rollout.agent.num_workers=1 reward.num_workers=1 data.dataloader_num_workers=0
    actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2
    actor_rollout_ref.actor.fsdp_config.dtype=float32 actor_rollout_ref.ref.fsdp_config.dtype=float32
    # FSDP computes in bf16 unless told otherwise: fp32 throughout, so the actor's log-probs match the rollout's
    "++actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    "++actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    actor_rollout_ref.actor.fsdp_config.use_torch_compile=false actor_rollout_ref.ref.fsdp_config.use_torch_compile=false
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
    actor_rollout_ref.model.enable_gradient_checkpointing=false
    actor_rollout_ref.rollout.calculate_log_probs=true
    # the search recipes: observation cut as the warm-up saw it (local.smoke.settings.SMOKE_MAX_OBS_TOKENS)
    ++actor_rollout_ref.rollout.custom.evidence_search.max_obs_tokens="${MAX_OBS_TOKENS:-256}"
    trainer.total_training_steps="${SMOKE_STEPS:-2}"
  )
}

# MODEL picks a hub id and a rollout tensor-parallel size; MODEL_PATH and TP override them.
ve_model_preset() {
  local hub tp
  case "${MODEL:?}" in
    qwen2.5-1.5b) hub=Qwen/Qwen2.5-1.5B-Instruct; tp=1 ;;
    qwen2.5-3b) hub=Qwen/Qwen2.5-3B-Instruct; tp=1 ;;
    qwen2.5-7b) hub=Qwen/Qwen2.5-7B-Instruct; tp=2 ;;
    qwen3-4b) hub=Qwen/Qwen3-4B; tp=1 ;;
    qwen3-8b) hub=Qwen/Qwen3-8B; tp=2 ;;
    llama3.2-3b) hub=meta-llama/Llama-3.2-3B-Instruct; tp=1 ;;
    llama3.1-8b) hub=meta-llama/Llama-3.1-8B-Instruct; tp=2 ;;
    *)
      if [ -z "${MODEL_PATH:-}" ]; then
        echo "unknown MODEL=$MODEL; set MODEL_PATH to use any other checkpoint" >&2
        exit 2
      fi
      hub="$MODEL_PATH"; tp=1 ;;
  esac
  MODEL_PATH="${MODEL_PATH:-$hub}"
  TP="${TP:-$tp}"
}

# Print one command so it can be pasted back: quoted, one flag or Hydra override per line.
ve_print() {
  local line="" arg
  for arg in "$@"; do
    if [ -n "$line" ] && { [[ "$arg" == --* ]] || [[ "$arg" == *=* ]]; }; then
      printf '%s \\\n' "$line"
      line="   "
    fi
    if [ -z "$line" ]; then line="$(printf '%q' "$arg")"; else line="$line $(printf '%q' "$arg")"; fi
  done
  printf '%s\n' "$line"
}

ve_server_healthy() {  # the run's token goes along: a server behind one may guard /health too
  local auth=()
  if [ -n "${VERL_EVIDENCE_RETRIEVAL_TOKEN:-}" ]; then auth=(-H @-); fi  # from stdin: never on a command line
  if command -v curl >/dev/null 2>&1; then  # cheaper than starting Python once a second
    printf 'Authorization: Bearer %s\n' "${VERL_EVIDENCE_RETRIEVAL_TOKEN:-}" |
      curl -fsS -m 2 -o /dev/null "${auth[@]}" "${1%/}/health" 2>/dev/null
    return
  fi
  "$VE_PYTHON" - "$1" <<'EOF' >/dev/null 2>&1
import os, sys, httpx
token = os.environ.get("VERL_EVIDENCE_RETRIEVAL_TOKEN")
headers = {"Authorization": f"Bearer {token}"} if token else {}
sys.exit(0 if httpx.get(sys.argv[1].rstrip("/") + "/health", headers=headers, timeout=2.0).status_code == 200 else 1)
EOF
}

# Until the server answers /health: if it exits first (a bad index, a busy port) or SERVER_WAIT runs out, say so and
# stop the trainer (the recipe shell's verl child), which would otherwise wait for it.
ve_watch_server() {
  local url="$1" server_pid="$2" recipe_pid="$3" waited=0 problem=""
  until ve_server_healthy "$url"; do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      problem="the retrieval server exited before it answered at $url"
      break
    fi
    if [ "$waited" -ge "${SERVER_WAIT:-600}" ]; then problem="no retrieval server at $url after ${waited}s"; break; fi
    sleep 1
    waited=$((waited + 1))
  done
  [ -n "$problem" ] || { echo "# retrieval server ready at $url after ${waited}s" >&2; return 0; }
  echo "$problem: stopping the trainer" >&2
  pkill -TERM -P "$recipe_pid" -f verl.trainer.main_ppo 2>/dev/null || true
  return 1
}

# A run whose retrieval would be the bundled demo corpus (no RETRIEVAL_URL, no --index-dir in SERVER_ARGS) trains
# on 322 passages without a word: refuse unless asked (ALLOW_DEMO_CORPUS=1). --smoke, make demo and the tests mean it;
# --dry-run and Hydra's --cfg print a warning instead, as they train nothing.
# $1 = 1: this recipe is about to start the server itself (whatever RETRIEVAL_URL says).
ve_demo_corpus_guard() {
  if [ "$SMOKE" = 1 ] || [ "${ALLOW_DEMO_CORPUS:-0}" = 1 ]; then return 0; fi
  if [ "${1:-0}" != 1 ] && [ -n "${RETRIEVAL_URL:-}" ]; then return 0; fi
  if [[ " ${SERVER_ARGS:-} " == *" --index-dir"* ]]; then return 0; fi
  local why="RETRIEVAL_URL is unset"
  if [ "${1:-0}" = 1 ]; then why="no server answers at RETRIEVAL_URL, so the recipe starts one,"; fi
  local problem="this run would retrieve from the bundled demo corpus (322 passages): $why and"
  problem="$problem SERVER_ARGS has no --index-dir. Point it at your index: RETRIEVAL_URL=http://<host>:<port> (a"
  problem="$problem running server) or SERVER_ARGS=\"--index-dir /path/to/index\"; ALLOW_DEMO_CORPUS=1 trains on"
  problem="$problem the demo corpus anyway"
  if [ "$DRY_RUN" = 1 ] || [ "${#HYDRA_FLAGS[@]}" -gt 0 ]; then echo "# warning: $problem" >&2; return 0; fi
  echo "error: $problem" >&2
  exit 2
}

# The retrieval server's bearer token: the user's (RETRIEVAL_SERVER_TOKEN or VERL_EVIDENCE_RETRIEVAL_TOKEN), else,
# when the server listens beyond this machine ($1 = 1), a new one for this run. Exported under both names: the server
# reads RETRIEVAL_SERVER_TOKEN, the search tool, both agent loops and the readiness checks
# VERL_EVIDENCE_RETRIEVAL_TOKEN. Only a fingerprint is ever printed.
ve_retrieval_token() {
  local token="${VERL_EVIDENCE_RETRIEVAL_TOKEN:-${RETRIEVAL_SERVER_TOKEN:-}}"
  if [ -z "$token" ] && [ "${1:-0}" = 1 ]; then token="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"; fi
  [ -n "$token" ] || return 0
  export RETRIEVAL_SERVER_TOKEN="$token" VERL_EVIDENCE_RETRIEVAL_TOKEN="$token"
}

ve_token_fingerprint() {  # a short hash that tells tokens apart without showing one
  printf '%s' "$1" | sha256sum | cut -c1-12
}

# Searching methods: use RETRIEVAL_URL if a server answers there, else plan to start one (SERVER_ARGS are passed to
# `verl-evidence serve`). ve_run starts it after the pre-flight check, and it stops when the recipe exits.
ve_retrieval_server() {
  ve_demo_corpus_guard
  RETRIEVAL_URL="${RETRIEVAL_URL:-http://127.0.0.1:${RETRIEVAL_PORT:-8000}}"
  export VERL_EVIDENCE_RETRIEVAL_URL="$RETRIEVAL_URL"  # read by the search tool in every Ray worker
  local hostport="${RETRIEVAL_URL#*://}"
  hostport="${hostport%%/*}"
  local host="${hostport%%:*}" port="${hostport##*:}"
  [[ "$port" =~ ^[0-9]+$ ]] || port="${RETRIEVAL_PORT:-8000}"
  # shellcheck disable=SC2206  # SERVER_ARGS is a list of flags by design
  VE_SERVE=(verl-evidence serve --port "$port" ${SERVER_ARGS:-})
  VE_SERVER_PLANNED=0
  local wide=0  # a server started here for other nodes listens on every interface: behind a token
  if [ "$START_SERVER" != 0 ] && [ "$host" = "$(hostname)" ]; then wide=1; fi
  ve_retrieval_token "$wide"
  echo "# retrieval server: $RETRIEVAL_URL"
  if [ -n "${VERL_EVIDENCE_RETRIEVAL_TOKEN:-}" ]; then
    echo "# retrieval token of the search clients: sha256 $(ve_token_fingerprint "$VERL_EVIDENCE_RETRIEVAL_TOKEN")"
  fi
  if [ "$START_SERVER" = 0 ]; then return 0; fi
  if [ "$DRY_RUN" = 1 ]; then
    echo "# started beside the trainer unless a server already answers there (SERVER_FIRST=1: before it):"
    ve_print "${VE_SERVE[@]}"
    return 0
  fi
  if ve_server_healthy "$RETRIEVAL_URL"; then return 0; fi
  case "$host" in
    127.0.0.1|localhost) ;;
    "$(hostname)") VE_SERVE+=(--host 0.0.0.0) ;;  # reachable by name from the other nodes
    *) echo "no retrieval server answers at $RETRIEVAL_URL and it is not this machine: start it there" >&2; exit 1 ;;
  esac
  ve_demo_corpus_guard 1  # a RETRIEVAL_URL on this machine that nothing answers: the server would be ours
  VE_SERVER_PLANNED=1
  if [ "${SERVER_FIRST:-0}" != 1 ]; then
    # The trainer starts while the server loads its index (minutes for wiki-18), instead of after it: every
    # rollout worker waits for /health before its first search, and a watcher stops the trainer if the server dies.
    export VERL_EVIDENCE_RETRIEVAL_WAIT_S="${SERVER_WAIT:-600}"
  fi
}

# Start the server ve_retrieval_server planned (none planned: nothing to do).
ve_start_retrieval_server() {
  [ "${VE_SERVER_PLANNED:-0}" = 1 ] || return 0
  "${VE_SERVE[@]}" &
  VE_SERVER_PID=$!
  VE_WATCH_PID=""
  # The watcher is stopped first: a server this recipe stops on its way out has not "died before it answered".
  trap 'kill ${VE_WATCH_PID:+"$VE_WATCH_PID"} "$VE_SERVER_PID" 2>/dev/null || true' EXIT
  if [ "${SERVER_FIRST:-0}" != 1 ]; then
    ve_watch_server "$RETRIEVAL_URL" "$VE_SERVER_PID" "$$" &
    VE_WATCH_PID=$!
    return 0
  fi
  local waited=0
  until ve_server_healthy "$RETRIEVAL_URL"; do
    if ! kill -0 "$VE_SERVER_PID" 2>/dev/null; then echo "the retrieval server exited" >&2; exit 1; fi
    if [ "$waited" -ge "${SERVER_WAIT:-600}" ]; then
      echo "no retrieval server at $RETRIEVAL_URL after ${waited}s" >&2
      exit 1
    fi
    sleep 1  # a cheap local probe: poll often, the trainer starts as soon as the server answers
    waited=$((waited + 1))
  done
}

# Overrides every recipe shares: model, data, cluster, rollout engine, logging.
ve_common_overrides() {
  # shellcheck disable=SC2034  # read by the recipe after this call
  COMMON_ARGS=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    data.train_files="$TRAIN_FILES"
    data.val_files="$VAL_FILES"
    data.filter_overlong_prompts=true
    trainer.nnodes="${NNODES:-1}"
    trainer.n_gpus_per_node="$GPUS_PER_NODE"
    actor_rollout_ref.rollout.name="${ROLLOUT_ENGINE:-vllm}"
    actor_rollout_ref.rollout.tensor_model_parallel_size="$TP"
    actor_rollout_ref.rollout.gpu_memory_utilization="${GPU_MEM_UTIL:-0.6}"
    actor_rollout_ref.actor.use_dynamic_bsz=true
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu="${MAX_TOKENS_PER_GPU:-16384}"
    actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.actor.fsdp_config.param_offload="${PARAM_OFFLOAD:-false}"
    actor_rollout_ref.actor.fsdp_config.optimizer_offload="${OPTIMIZER_OFFLOAD:-false}"
    trainer.project_name="${PROJECT:-verl-evidence}"
    trainer.experiment_name="$EXPERIMENT"
    trainer.logger="${LOGGER:-[console]}"
    trainer.save_freq="${SAVE_FREQ:-100}"
    # A stopped run (preempted, requeued, out of time) started again continues from its last checkpoint here.
    trainer.resume_mode="${RESUME_MODE:-auto}"
    trainer.default_local_dir="${CHECKPOINT_DIR:-checkpoints/${PROJECT:-verl-evidence}/$EXPERIMENT}"
    trainer.test_freq="${TEST_FREQ:-50}"
    trainer.val_before_train="${VAL_BEFORE_TRAIN:-true}"
    # Every training step's reward components, rollout behaviour and masking check (docs/training-metrics.md);
    # MASK_CHECK=false logs the masking shares without stopping the run on a trained retrieved token.
    trainer.v1.sampler.custom_sampler.path=pkg://verl_evidence.trainer.step_sampler
    trainer.v1.sampler.custom_sampler.name=EvidenceReplayBuffer
    "++trainer.v1.sampler.sampler_kwargs.reward_manager=\${reward.reward_manager.name}"
    "++trainer.v1.sampler.sampler_kwargs.reward_function=\${reward.custom_reward_function.path}"
    ++trainer.v1.sampler.sampler_kwargs.mask_check="${MASK_CHECK:-true}"
  )
  # Every Ray worker of the run starts through verl_evidence.worker_setup (higher garbage-collector thresholds: ~1
  # CPU-s less per worker importing verl, measured); WORKER_SETUP_HOOK= (empty) starts them as Ray does.
  local hook="${WORKER_SETUP_HOOK-verl_evidence.worker_setup.setup_worker}"
  if [ -n "$hook" ]; then COMMON_ARGS+=("++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=$hook"); fi
  if [ -n "${VERL_EVIDENCE_GC_THRESHOLD:-}" ]; then  # through Ray: the workers of a joined cluster lack our env
    COMMON_ARGS+=("++ray_kwargs.ray_init.runtime_env.env_vars.VERL_EVIDENCE_GC_THRESHOLD='$VERL_EVIDENCE_GC_THRESHOLD'")
  fi
}

# Search rollout: the text-tag `evidence_search` loop (default) or, with
# ROLLOUT_PRESET=tool_agent, verl's native function-calling loop with the search tool preset.
ve_search_overrides() {
  local turns=$((${MAX_SEARCHES:?} + 1))
  if [ "${ROLLOUT_PRESET:-search}" = tool_agent ]; then
    # shellcheck disable=SC2034  # read by the recipe after this call
    SEARCH_ARGS=(
      rollout_preset=tool_agent
      actor_rollout_ref.rollout.multi_turn.tool_config_path="$VE_PRESETS/search_tool.yaml"
      actor_rollout_ref.rollout.multi_turn.max_assistant_turns="$turns"
    )
  else
    # shellcheck disable=SC2034
    SEARCH_ARGS=(
      rollout_preset="${ROLLOUT_PRESET:-search}"
      ++actor_rollout_ref.rollout.custom.evidence_search.retrieval_url="$RETRIEVAL_URL"
      ++actor_rollout_ref.rollout.custom.evidence_search.topk="${TOPK:?}"
      ++actor_rollout_ref.rollout.custom.evidence_search.max_turns="$turns"
    )
    # A server loading beside the trainer: said in the config too, which reaches workers on every node (the env
    # variable reaches only this node's).
    if [ -n "${VERL_EVIDENCE_RETRIEVAL_WAIT_S:-}" ]; then
      local wait_key=++actor_rollout_ref.rollout.custom.evidence_search.search_wait_for_server_s
      SEARCH_ARGS+=("$wait_key=$VERL_EVIDENCE_RETRIEVAL_WAIT_S")
    fi
  fi
}

# Print the trainer command; run it unless --dry-run. Hydra overrides come last so they win. Before anything starts,
# recipes/preflight.py checks that the reward, rollout and data fit (PREFLIGHT=0 skips it, at the user's word).
ve_run() {
  local cmd=("$VE_PYTHON" -m verl.trainer.main_ppo "${HYDRA_FLAGS[@]}" "$@" "${SMOKE_ARGS[@]}" "${EXTRA_ARGS[@]}")
  echo "# trainer:"
  ve_print "${cmd[@]}"
  if [ "$DRY_RUN" = 1 ]; then return 0; fi
  ve_need_python
  if [ "${#HYDRA_FLAGS[@]}" = 0 ] && [ "${PREFLIGHT:-1}" != 0 ]; then
    "$VE_PYTHON" "$VE_RECIPES/preflight.py" "$@" "${SMOKE_ARGS[@]}" "${EXTRA_ARGS[@]}" || exit 2
  fi
  if [ "${#HYDRA_FLAGS[@]}" = 0 ]; then ve_start_retrieval_server; fi  # --cfg prints a config: no server needed
  "${cmd[@]}"
}
