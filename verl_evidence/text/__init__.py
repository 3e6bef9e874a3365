"""Text utilities shared by rewards, rollouts, data preparation and evaluation (pure Python, no verl/torch/ray).

- :mod:`~verl_evidence.text.tags`: protocol tags in model output (``extract_last``, ``find_blocks``, ``tag_events``,
  ``block_sequence``, ``strip_thinking``).
- :mod:`~verl_evidence.text.stops`: where generated token ids end at a stop string or stop token.
- :mod:`~verl_evidence.text.ground_truth`: a parquet row's ``reward_model.ground_truth`` as ``{"target", "evidence",
  "answerable"}``, and the one true/false parser.

The QA metrics and ROUGE-L are the rewards' own: :mod:`verl_evidence.rewards.qa_metrics`,
:mod:`verl_evidence.rewards.rouge`. Nothing here raises on model output.
"""
