"""Data preparation formats passages as the search tool does without importing verl (issue 23: a fast CLI)."""

from __future__ import annotations

import subprocess
import sys


def test_document_formatting_and_templates_import_no_verl_torch_or_ray() -> None:
    code = (
        "import sys\n"
        "import verl_evidence.tools.documents, verl_evidence.tools.search_settings, verl_evidence.dataprep.templates\n"
        "print(sorted(m for m in ('verl', 'torch', 'ray') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_tool_formats_with_the_pure_helpers() -> None:
    from verl_evidence.dataprep.templates import format_documents as used_by_data_prep
    from verl_evidence.tools import documents

    assert used_by_data_prep is documents.format_documents
    hits = [{"document": {"id": "a", "contents": '"Nile"\nThe Nile flows north.'}}, {"document": {"id": "b"}}]
    assert documents.format_documents(hits) == "Doc 1 (Title: Nile) The Nile flows north.\nDoc 2 (Title: ) "
    assert documents.document_ids(hits) == ["a", "b"]
    assert documents.document_texts(hits) == ["The Nile flows north."]
