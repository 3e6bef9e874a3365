"""A faiss index's search parameter chosen by measured recall against exact search (build, convert, adopt).

Recall here is of the exact nearest neighbours, not of gold passages (that is :mod:`retrieval_server.recall`).
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)


def neighbour_recall(exact: np.ndarray, approx: np.ndarray, k: int, exclude: np.ndarray | None = None) -> float:
    """Mean fraction of each query's exact top-k rows that an approximate search also ranks in its top-k.

    ``exact``/``approx`` are ``(n_queries, depth)`` row arrays (-1 = no hit). ``exclude[i]`` (e.g. the
    passage a query vector was taken from) is dropped from both rankings before cutting at k.
    """
    total = 0.0
    for i in range(len(exact)):
        drop = {-1} if exclude is None else {-1, int(exclude[i])}
        truth = [int(r) for r in exact[i] if int(r) not in drop][:k]
        found = [int(r) for r in approx[i] if int(r) not in drop][:k]
        total += len(set(truth) & set(found)) / max(len(truth), 1)
    return total / max(len(exact), 1)


# ---------------------------------------------------------------- search parameters chosen by measured recall
DEFAULT_TARGET_RECALL = 0.95
# A doubling that gains less than this is a plateau: past it, PQ's codes (not the search) limit the recall.
PLATEAU_GAIN = 0.005


def speed_knob(index) -> tuple[str, list[int]] | None:
    """The search parameter trading speed for recall in ``index`` and the values worth trying, smallest first:
    ``nprobe`` 1, 2, 4, ... up to the list count for IVF, ``efSearch`` 16 ... 1024 for HNSW; None for an exhaustive
    index (Flat, SQ, PQ), which has none."""
    import faiss

    try:
        nlist = int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:
        nlist = None
    if nlist is not None:
        return "nprobe", [2**i for i in range(nlist.bit_length()) if 2**i < nlist] + [nlist]
    if isinstance(faiss.downcast_index(index), faiss.IndexHNSW):
        return "efSearch", [16, 32, 64, 128, 256, 512, 1024]
    return None


def measure_settings(
    index, queries: np.ndarray, exact: np.ndarray, k: int, settings: list[str], exclude: np.ndarray | None = None
) -> list[dict]:
    """recall@k of ``index`` against the ``exact`` rows, and its search time, at each faiss parameter setting."""
    import time

    import faiss

    out = []
    for setting in settings:
        if setting:
            faiss.ParameterSpace().set_index_parameters(index, setting)
        started = time.perf_counter()
        _, approx = index.search(queries, exact.shape[1])
        seconds = time.perf_counter() - started
        out.append(
            {
                "search_params": setting,
                f"recall@{k}": round(neighbour_recall(exact, approx, k, exclude=exclude), 4),
                "ms_per_query": round(1000 * seconds / len(queries), 3),
            }
        )
    return out


def choose_search_params(
    index,
    queries: np.ndarray,
    exact: np.ndarray,
    k: int,
    exclude: np.ndarray | None = None,
    target: float = DEFAULT_TARGET_RECALL,
    settings: list[str] | None = None,
) -> dict:
    """Measure recall@k at increasing settings and pick the one to serve at; the index is left set to it.

    Without ``settings``, the :func:`speed_knob` values are tried in order and the sweep stops at the first
    reaching ``target``, or after two doublings that each gained less than :data:`PLATEAU_GAIN`. The choice:
    the first setting reaching ``target``, else the smallest within :data:`PLATEAU_GAIN` of the best measured.
    Returns ``{"search_params", "target_recall", "k", "recall": [rows]}`` (``search_params`` "" when the index has
    nothing to set).
    """
    import faiss

    queries = np.ascontiguousarray(queries, dtype=np.float32)
    key = f"recall@{k}"
    if settings is None:
        knob = speed_knob(index)
        if knob is None:
            rows = measure_settings(index, queries, exact, k, [""], exclude)
        else:
            rows = []
            for value in knob[1]:
                rows += measure_settings(index, queries, exact, k, [f"{knob[0]}={value}"], exclude)
                gains = [b[key] - a[key] for a, b in zip(rows, rows[1:])]
                if rows[-1][key] >= target or (len(gains) >= 2 and max(gains[-2:]) < PLATEAU_GAIN):
                    break
    else:
        rows = measure_settings(index, queries, exact, k, settings, exclude)
    reaching = [row for row in rows if row[key] >= target]
    if reaching:
        chosen = reaching[0]
    else:
        best = max(row[key] for row in rows)
        chosen = next(row for row in rows if row[key] >= best - PLATEAU_GAIN)
        logger.warning(
            "no setting reached %s %.2f (best %.3f): the index's codes cap its recall; serving at %s, the smallest "
            "within %.3f of the best",
            key, target, best, chosen["search_params"] or "its defaults", PLATEAU_GAIN,
        )  # fmt: skip
    if chosen["search_params"]:
        faiss.ParameterSpace().set_index_parameters(index, chosen["search_params"])
    return {"search_params": chosen["search_params"], "target_recall": target, "k": k, "recall": rows}
