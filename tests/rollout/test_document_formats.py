"""The two passage layouts (verl_evidence.tools.documents): ours, and Search-R1's for its prompt's readers."""

from __future__ import annotations

import pytest

from verl_evidence.tools import documents

# FlashRAG's wiki-18 keeps the title's quotes in the first line of `contents`
HITS = [
    {"document": {"id": "p1", "contents": '"Nile"\nThe Nile flows north.\nIt floods yearly.'}},
    {"document": {"id": "p2", "contents": "A passage without a title line"}},
]


def test_search_r1_layout_is_search_r1s_own() -> None:
    """Title verbatim after `Doc i(`, no space; the text's lines as they are; every document ends in a newline."""
    assert documents.format_documents(HITS, "search_r1") == (
        'Doc 1(Title: "Nile") The Nile flows north.\nIt floods yearly.\nDoc 2(Title: A passage without a title line) \n'
    )
    assert documents.format_documents(HITS) == (
        "Doc 1 (Title: Nile) The Nile flows north.\nIt floods yearly.\nDoc 2 (Title: ) A passage without a title line"
    )
    several = documents.format_search_results(["nile", "rivers"], [HITS[:1], HITS[1:]], "search_r1")
    assert several.startswith("Results for 'nile':\nDoc 1(Title: \"Nile\") ")


def test_the_prompt_picks_the_layout_and_an_unknown_layout_is_refused() -> None:
    assert documents.document_format_for_prompt("search_r1") == "search_r1"
    assert {documents.document_format_for_prompt(p) for p in ("evinote_sen", "grace", None)} == {"ours"}
    with pytest.raises(ValueError, match="document_format must be one of ours, search_r1, got 'searchr1'"):
        documents.format_documents(HITS, "searchr1")


def test_the_search_loop_resolves_auto_from_the_rows_prompt() -> None:
    """`document_format: auto` reads the row's method, whose data-prep prompt names the layout."""
    from verl_evidence.agent_loops.search_loop import SearchLoopSettings
    from verl_evidence.dataprep.templates import DEFAULT_PROMPTS

    assert documents.document_format_for_prompt(DEFAULT_PROMPTS["search_r1"]) == "search_r1"
    assert documents.document_format_for_prompt(DEFAULT_PROMPTS["evinote"]) == "ours"
    assert SearchLoopSettings().document_format == "auto"
    with pytest.raises(ValueError, match="document_format must be auto or one of"):
        SearchLoopSettings(document_format="searchr1")


def test_the_search_tool_takes_the_layout_from_its_config() -> None:
    from verl_evidence.tools.search_tool import SearchTool

    config = {"type": "native", "retrieval_url": "http://127.0.0.1:9"}
    assert SearchTool(config).document_format == "ours"
    assert SearchTool({**config, "document_format": "search_r1"}).document_format == "search_r1"
    with pytest.raises(ValueError, match="document_format must be one of ours, search_r1"):
        SearchTool({**config, "document_format": "auto"})
