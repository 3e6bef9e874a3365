"""Retrieval server for agentic RAG rollouts: sentence encoder + FAISS/BM25 behind Ray Serve.

Speaks the ``POST /retrieve`` JSON contract of Search-R1 / verl's former example
server, so existing clients and servers interoperate.
"""

__version__ = "0.1.0"
