"""EviPath (seed 003): abductive planner/executor trajectory synthesis for SFT.

Modules: ``records`` (dataset readers → QARecord), ``teacher`` (OpenAI-compatible
client with cache), ``parsing`` (teacher replies), ``evidence`` (golden-evidence
selection), ``pipeline`` (synthesis and quality filter), ``writer`` (SFT parquet),
``cli`` (``verl-evidence evipath synthesize``).
"""
