"""EviOmni's noise-robustness evaluation (Fig. 5): k irrelevant passages added to each EviOmni row."""

from __future__ import annotations

import pytest

from verl_evidence.eval.noise import noise_level, parse_noise_levels, with_noise_passages
from verl_evidence.rewards.qa_metrics import normalize


@pytest.fixture(scope="module")
def bundled():
    """EviOmni rows of the bundled questions with their top-5 BM25 passages (as `data eviomni` writes them)."""
    from verl_evidence.dataprep import rows
    from verl_evidence.dataprep.records import bundled_paths, load_records, read_corpus
    from verl_evidence.dataprep.retrievers import Query, build_retriever
    from verl_evidence.dataprep.templates import load_template

    records = load_records("bundled", None, allow_new_source=False)[:6]
    corpus = read_corpus(bundled_paths()[1])
    ranked = build_retriever("bm25", corpus).retrieve([Query(r.id, r.question) for r in records], 5)
    passages = [[{"id": i, "contents": corpus[i]} for i in ids] for ids in ranked]
    written = rows.eviomni_rows(records, passages, load_template("eviomni"), "test", lambda t: len(t.split()))
    return written, corpus


def test_each_row_once_per_count_with_irrelevant_passages_after_its_own(bundled) -> None:
    rows, corpus = bundled
    noisy = with_noise_passages(rows, corpus, (0, 2, 8), count_tokens=lambda t: len(t.split()))
    assert len(noisy) == 3 * len(rows)
    for row, copies in zip(rows, (noisy[i : i + 3] for i in range(0, len(noisy), 3)), strict=True):
        own = row["extra_info"]["passages"]
        golds = [normalize(g) for g in row["reward_model"]["ground_truth"]["target"]]
        for k, copy in zip((0, 2, 8), copies, strict=True):
            extra = copy["extra_info"]
            assert copy["data_source"] == f"{row['data_source']}+noise{k}" and extra["noise_passages"] == k
            assert extra["id"] == f"{row['extra_info']['id']}+noise{k}"
            assert extra["passages"][: len(own)] == own and len(extra["passages"]) == len(own) + k
            added = extra["passages"][len(own) :]
            assert not {p["id"] for p in added} & {p["id"] for p in own}
            for passage in added:  # noise: none of them holds a gold answer
                assert not any(f" {g} " in f" {normalize(passage['contents'])} " for g in golds)
            prompt = copy["prompt"][-1]["content"]
            assert all(p["contents"].split("\n", 1)[-1][:40] in prompt for p in added)
            assert extra["eviomni_len_p"] > row["extra_info"]["eviomni_len_p"] or k == 0
        assert copies[0]["prompt"] == row["prompt"]  # k = 0: the row as it was, under its own source name
    assert rows[0]["data_source"] == "bundled" and "noise_passages" not in rows[0]["extra_info"]  # inputs untouched


def test_the_draw_is_the_same_on_every_run_and_changes_with_the_seed(bundled) -> None:
    rows, corpus = bundled
    ids = lambda out: [r["extra_info"]["noise_passage_ids"] for r in out]  # noqa: E731
    first = ids(with_noise_passages(rows, corpus, (4,)))
    assert ids(with_noise_passages(rows, corpus, (4,))) == first
    assert ids(with_noise_passages(rows, corpus, (4,), seed=1)) != first


def test_rows_without_passages_pass_through_and_bad_input_says_what_is_wrong(bundled) -> None:
    rows, corpus = bundled
    search_row = {"data_source": "nq", "prompt": [], "reward_model": {"ground_truth": {"target": ["x"]}}}
    out = with_noise_passages([search_row, rows[0]], corpus, (2,))
    assert out[0] is search_row and out[1]["data_source"] == "bundled+noise2"
    with pytest.raises(ValueError, match="none of these rows has passages"):
        with_noise_passages([search_row], corpus, (2,))
    with pytest.raises(ValueError, match=r"only \d passages irrelevant to row"):
        with_noise_passages(rows[:1], dict(list(corpus.items())[:2]), (4,))
    assert parse_noise_levels("0,2, 4") == (0, 2, 4)
    for bad in ("", "two", "2,2", "-1", "65"):
        with pytest.raises(ValueError, match="--noise-passages"):
            parse_noise_levels(bad)
    assert noise_level("nq+noise4") == ("nq", 4) and noise_level("nq") == ("nq", None)


def test_eval_refuses_inconsistent_options_before_starting_anything(tmp_path) -> None:
    from typer.testing import CliRunner

    from verl_evidence.cli import app

    cases = {
        ("--table", "4"): "give --paper too",
        ("--paper", "evinote", "--table", "9"): "no table '9'",
        ("--noise-passages", "1,x"): "comma-separated counts",
        ("--noise-passages", "2", "--data", str(tmp_path / "rows.jsonl")): "give --corpus",
    }
    (tmp_path / "rows.jsonl").write_text('{"prompt": [], "reward_model": {}, "data_source": "nq"}\n')
    for args, message in cases.items():
        result = CliRunner().invoke(app, ["eval", *args, "--out", str(tmp_path / "out")])
        assert result.exit_code == 2 and message in " ".join(result.output.split()), (args, result.output)
        assert not (tmp_path / "out").exists()
