"""Data preparation: QA sets and corpora -> verl parquet rows for each method.

Layout (pure core, thin adapters):
    records      input readers (FlashRAG JSONL, Search-R1 parquet, bundled set) and validation
    templates    chat prompt templates, loaded from a file or a packaged prompt name
    retrievers   the ``Retriever`` interface: oracle, random, BM25 (bm25s), dense
                 (sentence-transformers), dense+rerank (cross-encoder), retrieval server
    grace        GRACE contexts: the balanced training set, the natural test set, answer labelling
    mix          several inputs into one ``data qa`` file, ``--sample`` per data source, the summary file
    rows         verl parquet rows per method and the pyarrow writer
    cli          ``verl-evidence data ...``
"""
