"""An index factory checked before any passage is encoded: faiss must be able to make it for the encoder's vectors
and to train it on the vectors the build will sample.

faiss says so itself only when it trains, after the corpus is encoded (minutes to hours): "Number of training points
(322) should be at least as large as number of clusters (4096)". The empty index tells us the same up front: k-means
needs at least one training vector per IVF list (``nlist``) and per PQ centroid (``ksub``, also OPQ's rotation).
"""

from __future__ import annotations

import re

# faiss's own advice: fewer than 39 training points per centroid gives a warning, so suggest lists of that size
POINTS_PER_CENTROID = 39


class IndexFactoryError(ValueError):
    """An index factory faiss cannot make for these vectors, or cannot train on the vectors the build samples."""


def faiss_reason(err: RuntimeError) -> str:
    """faiss's message without its C++ location (``Error in <function> at <file>:<line>: <message>``)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    found = re.search(r" at \S+:\d+: (.*)$", text)
    return (found.group(1) if found else text).removeprefix("Error: ")


def training_needs(index) -> dict[str, int]:
    """What an empty (untrained) faiss index needs at least one training vector each of, by name."""
    import faiss

    needs: dict[str, int] = {}
    top = faiss.downcast_index(index)
    parts = [top]
    if isinstance(top, faiss.IndexPreTransform):
        for i in range(top.chain.size()):
            transform = faiss.downcast_VectorTransform(top.chain.at(i))
            if isinstance(transform, faiss.OPQMatrix):
                needs["OPQ centroids"] = 256  # OPQMatrix trains an 8-bit product quantizer
        parts.append(faiss.downcast_index(top.index))
    try:
        ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
        needs["IVF lists"] = int(ivf.nlist)
        parts.append(ivf)
    except RuntimeError:  # not an IVF index
        pass
    for part in list(parts):
        storage = getattr(part, "storage", None)  # HNSW over PQ codes
        if storage is not None:
            parts.append(faiss.downcast_index(storage))
    for part in parts:
        pq = getattr(part, "pq", None)
        if pq is not None:
            needs["PQ centroids"] = max(needs.get("PQ centroids", 0), int(pq.ksub))
    return needs


def check_factory(factory: str, dim: int, passages: int, train_sample: int) -> None:
    """Raise :class:`IndexFactoryError` unless faiss can make ``factory`` for ``dim``-d vectors and train it on
    ``min(passages, train_sample)`` of them."""
    import faiss

    try:
        empty = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as err:
        raise IndexFactoryError(
            f"index factory {factory!r} (--factory): faiss cannot make it for the encoder's {dim}-d vectors "
            f"({faiss_reason(err)}); e.g. Flat, HNSW32,Flat, IVF1024,Flat or IVF4096,PQ{_pq_split(dim)}"
        ) from None
    if empty.is_trained:
        return
    vectors = min(passages, train_sample)
    needs = training_needs(empty)
    if not needs or max(needs.values()) <= vectors:
        return
    what, most = max(needs.items(), key=lambda item: item[1])
    if passages < most:
        lists = _power_of_two_below(passages // POINTS_PER_CENTROID)
        smaller = f"IVF{lists},Flat" if lists >= 2 else "HNSW32,Flat"
        fix = f"for a corpus this small use Flat, HNSW32,Flat or {smaller}"
    else:
        fix = f"raise --train-sample to at least {most} (about {most * POINTS_PER_CENTROID} for good lists)"
    raise IndexFactoryError(
        f"index factory {factory!r} (--factory) trains {most} {what} and the build would train it on {vectors} "
        f"vectors ({passages} passages, --train-sample {train_sample}); faiss needs at least one per centroid: {fix}"
    )


def _power_of_two_below(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


def _pq_split(dim: int) -> int:
    """A PQ code count dividing ``dim`` (faiss requires it), near dim / 8."""
    return max((m for m in range(1, dim + 1) if dim % m == 0 and m <= max(dim // 8, 1)), default=1)
