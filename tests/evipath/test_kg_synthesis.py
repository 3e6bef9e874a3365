"""EviPath's knowledge-graph planner form wired into synthesis: ``evipath synthesize --planner-form kg --graph``.

The scripted teacher of conftest answers the executor steps; the planner's KG turns (Search([i], "q") over the
numbered candidates) are scripted here. The graph is a tiny in-memory triple file; no network.
"""

from __future__ import annotations

import asyncio
import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from verl_evidence.cli import app
from verl_evidence.evipath import cli as evipath_cli
from verl_evidence.evipath.demonstrations import load_demonstrations
from verl_evidence.evipath.kg import TripleStore
from verl_evidence.evipath.kg_synthesis import KGSynthesizer, kg_record, load_kg_records
from verl_evidence.evipath.pipeline import Rejection
from verl_evidence.evipath.teacher import Teacher, TeacherConfig
from verl_evidence.prompts import load_prompt

QUESTION = "Which film has the director born earlier, Ek Paheli or When Father Was Away on Business?"
GRAPH = [
    ["Ek Paheli", "director", "Naresh Kumar"],
    ["Ek Paheli", "publication date", "1971"],
    ["When Father Was Away on Business", "director", "Emir Kusturica"],
    ["When Father Was Away on Business", "country of origin", "Yugoslavia"],
    ["Naresh Kumar", "date of birth", "22 December 1928"],
    ["Emir Kusturica", "date of birth", "24 November 1954"],
    ["Emir Kusturica", "occupation", "film director"],
    ["Salt to the Sea", "author", "Ruta Sepetys"],
]
# a 2WikiMultihopQA row: its candidates are the evidence subjects the question names
ROW = {
    "_id": "directors",
    "question": QUESTION,
    "answer": "Ek Paheli",
    "evidences": [GRAPH[0], GRAPH[2], GRAPH[4], GRAPH[5]],
}
KG_PLANNER = [
    (
        "<think>\nFind both directors, then both birth dates, then compare.\n</think>\n<action>\n"
        'Search([0], "Who directed Ek Paheli?")\nSearch([1], "Who directed When Father Was Away on Business?")\n'
        "</action>"
    ),
    (
        "<think>\nThe directors are Naresh Kumar [2] and Emir Kusturica [3]; now their birth dates.\n</think>\n"
        '<action>\nSearch([2], "When was Naresh Kumar born?")\nSearch([3], "When was Emir Kusturica born?")\n</action>'
    ),
    (
        "<think>\nNaresh Kumar (1928) was born before Emir Kusturica (1954), so Ek Paheli.\n</think>\n"
        "<answer> Ek Paheli </answer>"
    ),
]


@pytest.fixture
def kg_teacher(scripted):
    """conftest's scripted teacher for the executor steps; the KG planner's turns from ``script``."""

    class KGScriptedTeacher(scripted):
        def __init__(self, script=KG_PLANNER):
            super().__init__()
            self.script = script
            self.kg_system = load_prompt("evipath_planner_kg_synth").strip()
            self.kg_demos = {m["content"] for d in load_demonstrations("evipath_planner_kg_synth_demos") for m in d}
            self.planner_users: list[str] = []

        def __call__(self, messages):
            if messages[0]["content"] != self.kg_system:
                return super().__call__(messages)
            turns = [m for m in messages[1:] if m["content"] not in self.kg_demos]
            self.planner_users = [m["content"] for m in turns if m["role"] == "user"]
            return self.script[sum(1 for m in turns if m["role"] == "assistant")]

    return KGScriptedTeacher


def _write(tmp_path):
    (tmp_path / "triples.jsonl").write_text("".join(json.dumps(t) + "\n" for t in GRAPH))
    (tmp_path / "2wiki.jsonl").write_text(json.dumps(ROW) + "\n")
    return tmp_path / "2wiki.jsonl", tmp_path / "triples.jsonl"


def test_a_2wiki_row_becomes_a_kg_record() -> None:
    record = kg_record(ROW, "row 1")
    assert record.entities == ("Ek Paheli", "When Father Was Away on Business")
    assert record.evidence[0].text() == "(Ek Paheli, director, Naresh Kumar)"
    with pytest.raises(ValueError, match="row 2: no evidence triples"):
        kg_record({"question": "q?", "answer": "a"}, "row 2")


def test_synthesize_kg_form_end_to_end(chat_server, kg_teacher, selector, tmp_path, monkeypatch) -> None:
    # the session's MiniLM selector, already loaded, in place of the command's own load (cost, not behaviour)
    monkeypatch.setattr(evipath_cli, "EvidenceSelector", lambda *args, **kwargs: selector)
    teacher = kg_teacher()
    chat_server.reset(teacher)
    qa, graph = _write(tmp_path)
    out = tmp_path / "out"
    args = ["evipath", "synthesize", "--input", str(qa), "--planner-form", "kg", "--graph", str(graph)]
    args += ["--out", str(out), "--base-url", chat_server.base_url, "--model", "scripted", "--concurrency", "2"]
    result = CliRunner().invoke(app, args, env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "stats.json").read_text())
    assert stats["kept"] == 1 and stats["subquestions"] == 4, stats
    # the teacher saw the answer and the evidence; each observation numbered its new entities on
    assert teacher.planner_users[0].startswith(f"Question: {QUESTION}\nAnswer: Ek Paheli\nSupporting evidences:")
    assert teacher.planner_users[1].splitlines()[1:] == [
        "Ek Paheli was directed by Naresh Kumar. Candidate: [2] Naresh Kumar",
        "When Father Was Away on Business was directed by Emir Kusturica. Candidate: [3] Emir Kusturica",
    ]

    (planner,) = pq.read_table(out / "planner.parquet").to_pylist()
    messages = planner["messages"]
    assert messages[0] == {"role": "system", "content": load_prompt("evipath_planner_kg").strip()}
    # the student's question carries the candidates, never the answer or the evidence
    assert messages[1]["content"] == (
        f"Question: {QUESTION} Candidate: [0] Ek Paheli, [1] When Father Was Away on Business"
    )
    assert 'Search([0], "Who directed Ek Paheli?")' in messages[2]["content"]
    assert messages[3]["content"] == teacher.planner_users[1]
    assert 'Search([3], "When was Emir Kusturica born?")' in messages[4]["content"]
    assert messages[-1]["content"].endswith("<answer> Ek Paheli </answer>")
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 3

    executor = pq.read_table(out / "executor.parquet").to_pylist()
    assert len(executor) == 4
    first = next(r for r in executor if "Who directed Ek Paheli?" in r["messages"][1]["content"])
    pool = first["messages"][1]["content"]
    # the executor reads the chosen entity's facts as numbered triples, the graph's distractor among them
    assert "(Ek Paheli, director, Naresh Kumar)" in pool and "(Ek Paheli, publication date, 1971)" in pool
    assert "Emir Kusturica" not in pool


def test_kg_faults_reject_the_record_by_name(chat_server, kg_teacher, selector, tmp_path) -> None:
    records = load_kg_records(_write(tmp_path)[0])
    scripts = {
        # candidate [5] was never listed
        "planner_unknown_candidate": ['<think>x</think>\n<action>\nSearch([5], "Who directed Ek Paheli?")\n</action>'],
        # a graph without Ek Paheli's facts
        "entity_without_facts": KG_PLANNER,
    }
    graphs = {"planner_unknown_candidate": TripleStore(GRAPH), "entity_without_facts": TripleStore(GRAPH[2:])}
    config = TeacherConfig(model="scripted", base_url=chat_server.base_url, api_key="t", max_retries=0)
    for reason, script in scripts.items():
        chat_server.reset(kg_teacher(script))

        async def go(graph=graphs[reason]):
            teacher = Teacher(config, None)
            try:
                return await KGSynthesizer(teacher, selector, graph).synthesize(records)
            finally:
                await teacher.close()

        (result,) = asyncio.run(go())
        assert isinstance(result, Rejection) and result.reason == reason, result


def test_kg_options_that_do_not_fit_fail_in_one_line(tmp_path) -> None:
    qa, graph = _write(tmp_path)
    runner = CliRunner()
    base = ["evipath", "synthesize", "--model", "m", "--input", str(qa)]
    result = runner.invoke(app, [*base, "--graph", str(graph)])
    assert result.exit_code == 2 and "--planner-form kg" in result.output
    result = runner.invoke(app, [*base, "--planner-form", "kg", "--format", "hotpotqa"])
    assert result.exit_code == 2 and "give no --format" in result.output
    result = runner.invoke(app, [*base, "--planner-form", "kg", "--graph", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 2 and "none.jsonl" in result.output


class TinyRandomTeacher:
    """A real tiny random Qwen2 (chat template, greedy) behind the chat endpoint: garbage in every reply."""

    def __init__(self) -> None:
        from verl_evidence.local.tiny_models import tiny_causal_lm, tiny_tokenizer

        self.model, self.tokenizer, self.replies = tiny_causal_lm(seed=0), tiny_tokenizer(), []

    def __call__(self, messages: list[dict]) -> str:
        import torch

        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            out = self.model.generate(
                **ids, max_new_tokens=32, do_sample=False, pad_token_id=self.tokenizer.pad_token_id
            )
        self.replies.append(self.tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
        return self.replies[-1]


def test_a_garbage_kg_planner_costs_its_records_by_name(chat_server, selector, tmp_path) -> None:
    from verl_evidence.evipath.cli import run_synthesis

    teacher = TinyRandomTeacher()
    chat_server.reset(teacher)
    records = load_kg_records(_write(tmp_path)[0])
    config = TeacherConfig(model="tiny", base_url=chat_server.base_url, api_key="t", max_retries=0)
    summary = asyncio.run(run_synthesis(records, config, tmp_path / "out", None, selector, graph=TripleStore(GRAPH)))
    assert len(teacher.replies) == 1 and summary.stats.kept == 0  # one planner turn, then rejected
    (reason,) = summary.stats.rejected
    assert reason.startswith("planner_"), reason
    assert json.loads(summary.outputs["rejections"].read_text())["reason"] == reason
