"""The index's refusals, raised by the builder, the search and the ONNX exports beside an index.

Apart from :mod:`retrieval_server.index` so that the encoders' export cache can refuse an altered
export without importing the index module that imports the encoders.
"""

from __future__ import annotations


class IndexMismatchError(RuntimeError):
    """The index on disk does not belong to the corpus/model it is asked to serve."""


class SearchParamsError(IndexMismatchError):
    """``search_params`` that the index's type does not take (``nprobe`` on a Flat index)."""
