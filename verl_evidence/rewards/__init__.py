"""Pure reward functions: strings and numbers in, numbers out.

Nothing here imports verl, torch or ray, so the formulas can be read, tested and
reused on their own (like TRL's reward functions).

Modules (one per paper, plus the shared metrics; tag parsing and ground-truth coercion live in
``verl_evidence.text``):

- ``qa_metrics``: SQuAD normalisation, exact match, unigram F1, answer recall.
- ``rouge``: ROUGE-L F1 identical to rouge-score's stemmed ROUGE-L, faster.
- ``answer``: the answer-only rewards (Search-R1's exact match, answer F1).
- ``eviomni``: EviOmni / LEAR (``variant="lear"``), docs/methods/eviomni.md.
- ``evinote``: EviNote-RAG gate + EQR, docs/methods/evinote.md.
- ``grace``: GRACE gated reward, docs/methods/grace.md.

Each method module exposes a verl-compatible
``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``
returning a dict with ``"score"`` and the same float component keys for every
sample (``RESULT_KEYS`` of the module).
"""

__all__ = ["answer", "evinote", "eviomni", "grace", "qa_metrics", "rouge"]
