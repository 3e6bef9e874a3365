"""The Markdown report and its PNG plots."""

from __future__ import annotations

from PIL import Image

from verl_evidence.eval import report
from verl_evidence.eval.records import EvalRecord


def _records() -> list[EvalRecord]:
    out = []
    for i in range(6):
        good = i % 2 == 0
        out.append(
            EvalRecord(
                policy="replay",
                example_id=f"search/q{i}",
                data_source="nq" if i < 3 else "hotpotqa",
                rollout="search",
                question="q?",
                golden_answers=["paris"],
                prediction="paris" if good else "lyon",
                case="well_grounded" if good else "unsupported",
                num_searches=1 + i % 2,
                summary_count=1 if good else 0,
                eqr=0.3 if good else None,
                context_tokens=100 + 10 * i,
                raw_context_tokens=100 + 10 * i,
                rewards={"evinote": {"score": 1.3 if good else 0.0, "eqr": 0.3 if good else 0.0}},
            )
        )
    out.append(
        EvalRecord(
            policy="replay",
            example_id="grace/q0",
            data_source="nq",
            rollout="grace",
            question="q?",
            golden_answers=["paris"],
            prediction="paris",
            case="well_grounded",
            answerable=True,
            refused=False,
            rewards={"grace": {"score": 3.2, "format": 0.5, "path": 1.0}},
        )
    )
    out.append(
        EvalRecord(
            policy="replay",
            example_id="grace/q1",
            data_source="nq",
            rollout="grace",
            question="q?",
            golden_answers=["paris"],
            prediction="paris",
            case="wrong_refusal",
            answerable=True,
            refused=True,
            rewards={"grace": {"score": 0.5, "format": 0.5, "path": 0.0}},
            error=None,
        )
    )
    return out


def test_report_has_metric_and_reward_tables_and_valid_pngs(tmp_path) -> None:
    result = report.write_report(_records(), tmp_path, title="T", notes=["the judge is random"])
    text = result.markdown.read_text()
    assert result.markdown == tmp_path / "report.md"
    assert text.startswith("# T")
    assert "- the judge is random" in text
    # metrics table: one row per (rollout, source) plus "all" for the multi-source rollout
    assert "| search | hotpotqa |" in text and "| search | nq |" in text and "| search | all |" in text
    assert "| grace | nq |" in text
    assert "balanced acc." not in text  # only answerable GRACE examples: undefined, so no column
    assert "overall acc." in text and "note rate" in text
    # reward tables: one per manager, one row per case
    assert "### `evinote`" in text and "### `grace`" in text
    assert "| search | well_grounded | 3 | 1.300 | 0.300 |" in text
    assert "| grace | wrong_refusal | 1 | 0.500 | 0.500 | 0.000 |" in text
    assert "| grace | well_grounded | 1 | 3.200 | 0.500 | 1.000 |" in text
    names = {p.name for p in result.images}
    assert names == {
        report.REWARD_COMPONENTS_PNG,
        report.REWARDS_BY_CASE_PNG,
        report.ACCURACY_PNG,
        report.CONTEXT_TOKENS_PNG,
    }
    for png in result.images:
        assert f"]({png.name})" in text
        with Image.open(png) as img:
            img.verify()
            assert img.format == "PNG"
        with Image.open(png) as img:
            assert img.size[0] > 200 and img.size[1] > 100


def test_report_without_rewards_or_tokens_skips_those_plots(tmp_path) -> None:
    bare = [
        EvalRecord(
            policy="p",
            example_id="a",
            data_source="nq",
            rollout="search",
            question="q",
            golden_answers=["x"],
            prediction="x",
            error="server unreachable",
        )
    ]
    result = report.write_report(bare, tmp_path)
    assert [p.name for p in result.images] == [report.ACCURACY_PNG]
    text = result.markdown.read_text()
    assert "## Rewards per component" not in text
    assert "## Examples that failed" in text and "server unreachable" in text


def test_format_value() -> None:
    assert report.format_value(None) == "n/a"
    assert report.format_value(float("nan")) == "n/a"
    assert report.format_value(3) == "3"
    assert report.format_value(3.0) == "3.000"
    assert report.format_value(0.0) == "0.000"
    assert report.format_value(0.12345) == "0.123"
