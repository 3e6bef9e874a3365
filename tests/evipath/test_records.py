"""Dataset layouts → the common (q, a, F, F^) record."""

from __future__ import annotations

import json

import pytest

from verl_evidence.evipath.records import ReadReport, iter_records, load_records


def test_hotpot_layout_from_json_array(tmp_path):
    rows = [
        {
            "_id": "h1",
            "question": "Q?",
            "answer": "A",
            "context": [["T1", ["s0", "s1"]], ["T2", ["u0", "  ", "u2"]]],
            "supporting_facts": [["T2", 2], ["T1", 0]],
        }
    ]
    path = tmp_path / "hotpot_train.json"
    path.write_text(json.dumps(rows))
    (record,) = load_records(path, "hotpotqa")
    assert record.facts == ("T1: s0", "T1: s1", "T2: u0", "T2: u2")
    assert record.golden_facts == ["T1: s0", "T2: u2"]
    assert record.answers == ("A",) and record.source == "hotpotqa"


def test_2wiki_hf_layout():
    row = {
        "id": "w1",
        "question": "Q?",
        "answer": "A",
        "context": [{"title": "T", "sentences": ["x", "y"]}],
        "supporting_facts": {"title": ["T"], "sent_id": [1]},
    }
    (record,) = iter_records([row], "2wiki")
    assert record.golden_facts == ["T: y"] and record.source == "2wiki"


def test_musique_layout_with_aliases(tmp_path):
    row = {
        "id": "m1",
        "question": "Q?",
        "answer": "Paris",
        "answer_aliases": ["City of Light", "Paris"],
        "answerable": True,
        "paragraphs": [
            {"idx": 0, "title": "A", "paragraph_text": "a text", "is_supporting": False},
            {"idx": 1, "title": "B", "paragraph_text": "b text", "is_supporting": True},
        ],
    }
    path = tmp_path / "musique.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (record,) = load_records(path, "musique")
    assert record.answers == ("Paris", "City of Light")
    assert record.facts == ("A: a text", "B: b text") and record.golden == (1,)


def test_bundled_layout(tmp_path):
    corpus = [
        {
            "id": "p1",
            "contents": "Houston Baptist University\nHouston Baptist University was founded in 1960. It is private.",
        },
        {"id": "p2", "contents": "Glamour\nGlamour is a magazine."},
    ]
    qa = {
        "id": "q1",
        "question": "When was HBU founded?",
        "golden_answers": ["1960"],
        "hops": 1,
        "gold_passage_ids": ["p1"],
        "gold_evidence": ["Houston Baptist University was founded in 1960."],
        "distractor_ids": ["p2"],
    }
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(c) for c in corpus) + "\n")
    (tmp_path / "qa.jsonl").write_text(json.dumps(qa) + "\n")
    (record,) = load_records(tmp_path / "qa.jsonl", "bundled")
    assert record.golden_facts == ["Houston Baptist University: Houston Baptist University was founded in 1960."]
    assert record.facts[1] == "Glamour: Glamour is a magazine."


def test_bad_rows_are_skipped_and_counted():
    rows = [
        {"_id": "ok", "question": "Q?", "answer": "A", "context": [["T", ["s"]]], "supporting_facts": [["T", 0]]},
        {"_id": "noq", "question": "", "answer": "A", "context": [["T", ["s"]]], "supporting_facts": [["T", 0]]},
        {"_id": "noans", "question": "Q?", "answer": "", "context": [["T", ["s"]]], "supporting_facts": [["T", 0]]},
        {"_id": "nogold", "question": "Q?", "answer": "A", "context": [["T", ["s"]]], "supporting_facts": []},
        {"_id": "outside", "question": "Q?", "answer": "A", "context": [["T", ["s"]]], "supporting_facts": [["T", 5]]},
        {"_id": "broken", "question": "Q?", "answer": "A", "context": 7, "supporting_facts": []},
    ]
    report = ReadReport()
    records = list(iter_records(rows, "hotpotqa", report=report))
    assert [r.id for r in records] == ["ok"] and report.read == 1
    assert report.skipped["no question"] == 1
    assert report.skipped["no answer"] == 1
    assert report.skipped["no golden evidence"] == 1
    assert report.skipped["malformed row"] == 1
    assert sum(report.skipped.values()) == 5


def test_errors_name_the_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_records(tmp_path / "missing.json", "hotpotqa")
    (tmp_path / "qa.jsonl").write_text("{}\n")
    with pytest.raises(FileNotFoundError, match="corpus.jsonl"):
        load_records(tmp_path / "qa.jsonl", "bundled")
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{not json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_records(tmp_path / "bad.jsonl", "musique")
    with pytest.raises(ValueError, match="unknown format"):
        list(iter_records([], "squad"))
