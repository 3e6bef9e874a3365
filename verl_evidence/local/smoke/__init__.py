"""Smoke runs: a recipe through verl's own trainer on CPU, in about a minute.

``recipes/<name>.sh --smoke`` asks this package for three things and then runs
the recipe's ordinary verl command line in the CPU training mode
(:mod:`verl_evidence.local.cpu_mode`) with small batch, group and length settings:

1. a tiny policy (a 2-layer Qwen2 of hidden size 128 with the offline
   byte-level tokenizer) **warmed up** (a short supervised loop,
   :func:`.training.warm_up`) on the methods' output formats, built from the
   bundled questions' gold answers and evidence. A random tiny policy scores 0
   on every sample, so GRPO's advantages and gradients would all be 0 and the
   run would prove nothing; the warm-up makes it write the tags often enough
   for rewards to differ within a group;
2. the method's training data, prepared from the bundled set with the same
   ``verl-evidence data`` commands a user runs, restricted to the questions the
   policy was warmed up on (:func:`.warmup_data.warmed_up_rows`);
3. for EviNote, a small offline NLI judge whose entailment follows the note
   (:func:`verl_evidence.local.tiny_models.overlap_nli_model`).

Modules: :mod:`.settings` (what each method's run needs: one table, and the
cache directory), :mod:`.data` (the bundled data preparation),
:mod:`.warmup_data` (the warm-up examples), :mod:`.models` (the tiny policy and
judge), :mod:`.training` (the warm-up loop), :mod:`.logs` (verl's file-logger
metrics), :mod:`.cli` (``python -m verl_evidence.local.smoke prepare METHOD``).

Everything is cached under ``~/.cache/verl-evidence/smoke`` (or
``$VERL_EVIDENCE_SMOKE_DIR``), keyed by the format version, so only the first
smoke run on a machine pays for the warm-up.
"""
