"""Pure reward functions: strings and numbers in, numbers out.

Nothing here imports verl, torch or ray, so the formulas can be read, tested and
reused on their own (like TRL's reward functions).

Modules (one per paper, plus the shared text utilities):

- ``text``: normalize, exact_match, f1_score, answer_recall, rouge_l (identical
  to rouge-score's stemmed ROUGE-L F1, faster), tag extraction, ground-truth coercion.
- ``eviomni``: EviOmni / LEAR (``variant="lear"``), docs/methods/eviomni.md.
- ``evinote``: EviNote-RAG gate + EQR, docs/methods/evinote.md.
- ``grace``: GRACE gated reward, docs/methods/grace.md.

Each method module exposes a verl-compatible
``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``
returning a dict with ``"score"`` and the same float component keys for every
sample (``RESULT_KEYS`` of the module).
"""

__all__ = ["evinote", "eviomni", "grace", "text"]
