"""Evaluation harness: metrics, runner, results cache and report (``verl-evidence eval``)."""
