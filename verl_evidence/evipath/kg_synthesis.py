"""EviPath's synthesis in the knowledge-graph planner form (Table 8: 2Wiki-KG, QALD-10 over Wikidata).

The teacher, shown the question, its answer and the supporting triples, plays the planner over numbered candidate
entities: each ``Search([i], "q")`` is answered by the executor side over the facts the graph holds for candidate
``i``:

(i)   a_i from q_i and the entity's facts that support the answer (the record's evidence triples among them; all
      of the entity's facts when none is);
(ii)  the golden facts of the sub-question by cosine between a_i and those facts (Eq. 6, as the text form);
(iii) the teacher writes think -> ``<select>`` -> ``<answer>`` over the entity's facts, shuffled and numbered.

The answer of step (iii) is the observation; the entities it brings in as new candidates are the other ends of
the selected facts that the answer names. Kept and rejected as the text form is (:mod:`.pipeline`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_evidence.evipath.kg import (
    Candidates,
    KnowledgeGraph,
    Triple,
    TripleStore,
    observation_message,
    parse_kg_planner_turn,
    question_message,
    render_kg_turn,
)
from verl_evidence.evipath.parsing import Malformed, parse_answer_sentence, parse_executor_step
from verl_evidence.evipath.pipeline import (
    Prompts,
    SubQuestion,
    SynthesisConfig,
    Synthesizer,
    Trajectory,
    _Reject,
    answer_matches,
    executor_answer_user,
    executor_synth_user,
)
from verl_evidence.evipath.records import ReadReport

KG_PROMPTS = Prompts(planner_synth="evipath_planner_kg_synth", planner_synth_demos="evipath_planner_kg_synth_demos")
KG_PLANNER_PROMPT = "evipath_planner_kg"  # the fine-tuned planner's system prompt in the written data


@dataclass(frozen=True)
class KGRecord:
    """One KG problem: the question, its answers, the entities it names and the triples that answer it."""

    id: str
    question: str
    answers: tuple[str, ...]
    entities: tuple[str, ...]  # the question's candidates [0], [1], ...
    evidence: tuple[Triple, ...]
    source: str = "kg"

    @property
    def answer(self) -> str:
        return self.answers[0]


def _triple(value, where: str) -> Triple:
    if isinstance(value, dict):
        value = [value.get("subject"), value.get("relation"), value.get("object")]
    if not isinstance(value, (list, tuple)) or len(value) != 3 or not all(str(v or "").strip() for v in value):
        raise ValueError(f"{where}: a triple is [subject, relation, object], got {value!r}")
    return Triple(*(" ".join(str(v).split()) for v in value))


def kg_record(row: dict, where: str) -> KGRecord:
    """A row of 2WikiMultihopQA (``_id``, ``question``, ``answer``, ``evidences``) or our layout (``id``,
    ``question``, ``answer``/``answers``, ``evidence``, optional ``entities``). Without ``entities`` the question's
    candidates are the evidence subjects the question names, in order of appearance."""
    question = str(row.get("question") or "").strip()
    answers = row.get("answers") or row.get("answer")
    answers = tuple(a.strip() for a in ([answers] if isinstance(answers, str) else answers or []) if a.strip())
    triples = row.get("evidence", row.get("evidences")) or []
    if not question or not answers:
        raise ValueError(f"{where}: needs a question and an answer")
    evidence = tuple(_triple(t, where) for t in triples)
    if not evidence:
        raise ValueError(f"{where}: no evidence triples (2Wiki's 'evidences' or 'evidence')")
    entities = row.get("entities")
    if entities is None:
        lowered = question.casefold()
        named = {t.subject for t in evidence if t.subject.casefold() in lowered}
        entities = sorted(named, key=lambda name: lowered.index(name.casefold()))
    entities = tuple(" ".join(str(e).split()) for e in entities if str(e).strip())
    if not entities:
        raise ValueError(f"{where}: no candidate entity (give 'entities', or evidence subjects the question names)")
    return KGRecord(str(row.get("id", row.get("_id", where))), question, answers, entities, evidence)


def _rows(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    try:  # a JSON array of rows; else JSONL (whose lines may be arrays themselves: a triple file)
        rows = json.loads(text)
        if isinstance(rows, list) and all(isinstance(row, (dict, list)) for row in rows):
            return rows if not rows or isinstance(rows[0], dict) or isinstance(rows[0][0], list) else [rows]
    except json.JSONDecodeError:
        pass
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_kg_records(path: str | Path, limit: int | None = None, report: ReadReport | None = None) -> list[KGRecord]:
    """The KG records of a JSON array or JSONL file; a row that cannot be one is skipped and counted by reason."""
    report = report if report is not None else ReadReport()
    path = Path(path)
    records = []
    for number, row in enumerate(_rows(path), 1):
        report.read += 1
        try:
            records.append(kg_record(row, f"{path}:{number}"))
        except (ValueError, TypeError, AttributeError) as err:
            reason = str(err).split(": ", 1)[-1]
            report.skipped[reason] += 1
        if limit is not None and len(records) >= limit:
            break
    return records


def load_graph(path: str | Path) -> TripleStore:
    """A graph file: JSONL (or a JSON array) of ``[subject, relation, object]`` or ``{subject, relation, object}``."""
    path = Path(path)
    rows = _rows(path)
    return TripleStore(_triple(row, f"{path}:{number}") for number, row in enumerate(rows, 1))


def graph_of_records(records: Iterable[KGRecord]) -> TripleStore:
    """The records' own evidence triples as the graph (2Wiki-KG without a graph file)."""
    return TripleStore(dict.fromkeys(t for r in records for t in r.evidence))


def named_entities(sentence: str, facts: Sequence[Triple], entity: str) -> list[str]:
    """The other ends of ``facts`` that ``sentence`` names: the observation's new candidates."""
    lowered = " ".join(sentence.split()).casefold()
    found = []
    for fact in facts:
        for end in (fact.object, fact.subject):
            if end.casefold() != entity.casefold() and end.casefold() in lowered and end not in found:
                found.append(end)
    return found


@dataclass
class KGTrajectory(Trajectory):
    planner_users: list[str] | None = None  # the fine-tuned planner's user turns: question, then observations
    searched_entities: list[list[str]] | None = None  # per non-final turn, the entity each search started from


class KGSynthesizer(Synthesizer):
    """The text form's synthesizer with the KG planner's dialogue and the graph's facts as the executor's pool."""

    def __init__(self, teacher, selector, graph: KnowledgeGraph, config: SynthesisConfig | None = None):
        super().__init__(teacher, selector, config or SynthesisConfig(prompts=KG_PROMPTS))
        self.graph = graph

    def _pool(self, record: KGRecord, question: str, facts: Sequence[Triple]) -> list[Triple]:
        # Seeded by record and sub-question so a resumed run rebuilds identical prompts (cache hits).
        digest = hashlib.sha256(f"{self.config.seed}\x00{record.id}\x00{question}".encode()).digest()
        pool = list(dict.fromkeys(facts))
        random.Random(int.from_bytes(digest[:8], "little")).shuffle(pool)
        return pool

    async def execute_kg(self, record: KGRecord, entity: str, question: str) -> tuple[SubQuestion, list[str]]:
        facts = self.graph.facts(entity)
        if not facts:
            raise _Reject("entity_without_facts", f"{question!r}: the graph has no fact about {entity!r}")
        evidence = {t.text().casefold() for t in record.evidence}
        supporting = [t for t in facts if t.text().casefold() in evidence] or list(facts)
        golden = [t.text() for t in supporting]
        reply = await self._ask(
            "executor_answer", [{"role": "user", "content": executor_answer_user(question, golden)}]
        )
        answer_sentence = parse_answer_sentence(reply)
        if isinstance(answer_sentence, Malformed):
            raise _Reject(answer_sentence.reason, f"{question!r}: {answer_sentence.detail}")
        selection = await self._select(answer_sentence, golden)
        chosen = [golden[i] for i in selection.indices]
        pool_triples = self._pool(record, question, facts)
        pool = [t.text() for t in pool_triples]
        positions = sorted(pool.index(g) for g in chosen)
        reply = await self._ask(
            "executor_synth",
            [{"role": "user", "content": executor_synth_user(question, pool, answer_sentence, positions)}],
        )
        step = parse_executor_step(reply, len(pool))
        if isinstance(step, Malformed):
            raise _Reject(step.reason, f"{question!r}: {step.detail}")
        if self.config.require_golden_selection and not set(step.selected) & set(positions):
            raise _Reject("selection_no_golden", f"{question!r}: selected {list(step.selected)}, golden {positions}")
        sub = SubQuestion(
            question=question,
            answer_sentence=answer_sentence,
            golden=chosen,
            golden_scores=list(selection.scores),
            fallback=selection.fallback,
            pool=pool,
            golden_positions=positions,
            step=step,
        )
        selected = [pool_triples[i] for i in step.selected if 0 <= i < len(pool_triples)]
        return sub, named_entities(step.answer, selected, entity)

    async def _run(self, record: KGRecord) -> KGTrajectory:
        candidates = Candidates()
        teacher_question = question_message(
            record.question, candidates, record.entities, record.answer, record.evidence
        )
        planner_users = [question_message(record.question, Candidates(), record.entities)]
        dialogue = [{"role": "user", "content": teacher_question}]
        turns, subquestions, searched = [], [], []
        searches_made = 0
        for _ in range(self.config.max_steps):
            turn = parse_kg_planner_turn(await self._ask("planner_synth", dialogue), candidates)
            if isinstance(turn, Malformed):  # named as the text form's planner faults are, planner_*
                raise _Reject(f"planner_{turn.reason}", turn.detail)
            text = render_kg_turn(turn)
            turns.append(
                {
                    "think": turn.think,
                    "searches": [s.question for s in turn.searches],
                    "entities": [s.entity for s in turn.searches],
                    "answer": turn.answer,
                    "text": text,
                }
            )
            if turn.is_final:
                ok, em, f1 = answer_matches(turn.answer or "", record.answers, self.config.min_f1)
                if not ok:
                    raise _Reject("answer_mismatch", f"{turn.answer!r} vs {list(record.answers)} (F1 {f1:.2f})")
                if not subquestions:
                    raise _Reject("planner_no_search", "answered without any search")
                return KGTrajectory(record, turns, subquestions, turn.answer or "", em, f1, planner_users, searched)  # type: ignore[arg-type]
            searches_made += len(turn.searches)
            if searches_made > self.config.max_searches:
                raise _Reject("planner_too_many_searches", f"{searches_made} > {self.config.max_searches}")
            entities = [candidates.name(s.entity) or "" for s in turn.searches]
            outcomes = await asyncio.gather(
                *(self.execute_kg(record, e, s.question) for e, s in zip(entities, turn.searches)),
                return_exceptions=True,
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            subquestions.append([sub for sub, _ in outcomes])
            searched.append(entities)
            observation = observation_message([(sub.observation, new) for sub, new in outcomes], candidates)
            planner_users.append(observation)
            dialogue += [{"role": "assistant", "content": text}, {"role": "user", "content": observation}]
        raise _Reject("planner_max_steps", f"no answer after {self.config.max_steps} turns")
