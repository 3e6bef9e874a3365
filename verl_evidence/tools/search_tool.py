"""The ``search`` tool for verl's ``ToolAgentLoop``: a thin adapter over
:class:`~verl_evidence.tools.search_service.SearchService` (which the agent loops use directly).

:class:`SearchTool` is a verl ``BaseTool`` whose argument is a list of queries. It never raises into the rollout: a
down server or malformed arguments come back to the model as a short error text.

Settings: :class:`~verl_evidence.tools.search_settings.SearchSettings`, one class for the tool and both loops.
Documents are shown as :mod:`verl_evidence.tools.documents` formats them.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from retrieval_server.client import (
    RetrievalError,
    RetrievalRequestError,
)
from verl_evidence.tools.documents import check_document_format, document_ids, format_search_results
from verl_evidence.tools.search_service import SearchService
from verl_evidence.tools.search_settings import LOOP_ONLY_FIELDS, SearchSettings

logger = logging.getLogger(__name__)

SEARCH_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search a knowledge corpus. Returns the top passages for each query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "One or more fully specified search queries.",
                }
            },
            "required": ["query_list"],
        },
    },
}


def parse_query_list(parameters: Any, max_queries: int) -> list[str]:
    """The queries of a tool call, or TypeError/ValueError with a message meant for the model."""
    if not isinstance(parameters, dict):
        raise TypeError('arguments must be a JSON object like {"query_list": ["..."]}')
    queries = parameters.get("query_list", parameters.get("query"))
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not queries:
        raise ValueError("`query_list` must be a non-empty list of strings")
    if not all(isinstance(q, str) and q.strip() for q in queries):
        raise ValueError("every entry of `query_list` must be a non-empty string")
    if len(queries) > max_queries:
        raise ValueError(f"at most {max_queries} queries per call, got {len(queries)}")
    return [q.strip() for q in queries]


class SearchTool(BaseTool):
    """verl tool ``search``: ``{"query_list": [str, ...]}`` -> formatted passages.

    Config keys (the ``config`` mapping of the tool YAML): the fields of :class:`SearchSettings` but the loops' own
    failure thresholds (:data:`~verl_evidence.tools.search_settings.TOOL_FIELDS`; docs/configuration.md lists them
    with their meanings), ``max_queries``, ``document_format`` (``ours``, or ``search_r1`` for a policy trained on
    Search-R1's layout: verl_evidence/tools/documents.py), and verl's own ``type``. Any other key fails, naming it.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        tool_schema = tool_schema or OpenAIFunctionToolSchema.model_validate(SEARCH_TOOL_SCHEMA)
        super().__init__(config or {}, tool_schema)
        cfg = dict(config or {})
        cfg.pop("type", None)  # verl's tool type (native), not a search setting
        self.max_queries = int(cfg.pop("max_queries", 3))
        self.document_format = check_document_format(str(cfg.pop("document_format", "ours")))
        loop_only = sorted(set(cfg) & set(LOOP_ONLY_FIELDS))
        if loop_only:
            raise ValueError(
                f"search tool config: {loop_only} only apply to this project's agent loops (as search_<key>); verl's "
                "ToolAgentLoop turns a tool's exception into text, so the tool cannot stop a rollout"
            )
        self.service = SearchService(settings=SearchSettings(**cfg))

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        try:
            queries = parse_query_list(parameters, self.max_queries)
        except (TypeError, ValueError) as err:
            logger.info("search tool: malformed arguments %r: %s", parameters, err)
            return ToolResponse(text=f"Search error: {err}."), 0.0, {"error": "bad_arguments"}
        try:
            results = await self.service.search(queries)
        except RetrievalRequestError as err:
            logger.warning("search tool: server rejected %r: %s", queries, err)
            return (
                ToolResponse(text=f"Search error: the request was rejected ({err.message})."),
                0.0,
                {"error": "rejected"},
            )
        except RetrievalError as err:
            logger.warning("search tool: retrieval unavailable: %s", err)
            return (
                ToolResponse(
                    text="Search error: the search engine is unavailable right now. Answer with what you know."
                ),
                0.0,
                {"error": "unavailable"},
            )
        metrics = {"num_queries": len(queries), "retrieved_ids": [document_ids(r) for r in results]}
        return ToolResponse(text=format_search_results(queries, results, self.document_format)), 0.0, metrics
