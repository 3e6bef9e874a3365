"""Abductive trajectory synthesis: planner loop, executor per sub-question, quality filter.

For a record (q, a, F, F^) the teacher, shown q, a and F^, plays the planner:
think → ``Search("sub-question")`` calls, turn after turn, until ``<answer>``.
Each search is answered by the executor side:

(i)   a_i from q_i and F^ (teacher, one sentence);
(ii)  F^_i ⊆ F^ by sentence-transformer cosine between a_i and each golden item
      (> tau, Eq. 6, else the best one);
(iii) the teacher writes think → ``<select>[indices]</select>`` → ``<answer>`` over
      the noisy pool F, shuffled and numbered, told a_i and where F^_i sits.

The answer of step (iii) is the planner's observation. A trajectory is kept
only if every step parsed, every selection cites golden evidence of its
sub-question, and the final answer matches a gold answer (EM, or F1 ≥ a
threshold). Every rejection carries a reason; nothing raises out of
:func:`synthesize_record`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from verl_evidence.evipath.demonstrations import DEFAULT_DEMONSTRATIONS, demonstration_messages
from verl_evidence.evipath.evidence import EvidenceSelector
from verl_evidence.evipath.parsing import (
    ExecutorStep,
    Malformed,
    parse_answer_sentence,
    parse_executor_step,
    parse_planner_turn,
    render_planner_turn,
)
from verl_evidence.evipath.protocol import executor_user, observation_text
from verl_evidence.evipath.records import QARecord
from verl_evidence.evipath.teacher import Teacher, TeacherError
from verl_evidence.prompts import load_prompt
from verl_evidence.rewards.qa_metrics import exact_match, f1_score

logger = logging.getLogger(__name__)

Message = dict[str, str]


@dataclass(frozen=True)
class Prompts:
    """System prompts and few-shot demonstrations (packaged names or file paths)."""

    planner_synth: str = "evipath_planner_synth"
    executor_answer: str = "evipath_executor_answer"
    executor_synth: str = "evipath_executor_synth"
    planner_synth_demos: str = "evipath_planner_synth_demos"
    executor_synth_demos: str = "evipath_executor_synth_demos"

    def text(self, which: str) -> str:
        return load_prompt(getattr(self, which)).strip()

    def demonstrations(self, which: str, count: int) -> list[Message]:
        """The demonstrations shown between the system prompt and the record (Tables 8-9); step (i) has none."""
        demos = {"planner_synth": self.planner_synth_demos, "executor_synth": self.executor_synth_demos}.get(which)
        return demonstration_messages(demos, count) if demos else []


@dataclass(frozen=True)
class SynthesisConfig:
    max_steps: int = 6  # planner turns, the final answer included
    max_searches: int = 12  # sub-questions per trajectory
    min_f1: float = 0.8  # a final answer passes with EM = 1 or F1 >= min_f1
    require_golden_selection: bool = True
    seed: int = 0
    prompts: Prompts = field(default_factory=Prompts)
    # worked dialogues shown to the teacher before each planner / executor-synthesis request; 0 = zero-shot
    demonstrations: int = DEFAULT_DEMONSTRATIONS


@dataclass
class SubQuestion:
    question: str
    answer_sentence: str  # a_i from step (i)
    golden: list[str]  # F^_i
    golden_scores: list[float]
    fallback: bool
    pool: list[str]  # F as shown, shuffled
    golden_positions: list[int]  # where F^_i sits in ``pool``
    step: ExecutorStep  # step (iii)

    @property
    def observation(self) -> str:
        return self.step.answer


@dataclass
class Trajectory:
    record: QARecord
    turns: list[dict]  # planner turns: {"think", "searches", "answer", "text"}
    subquestions: list[list[SubQuestion]]  # per non-final turn
    final_answer: str
    em: float
    f1: float


@dataclass
class Rejection:
    record: QARecord
    reason: str
    detail: str = ""


class _Reject(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _facts_block(facts: Sequence[str], numbered: bool) -> str:
    if numbered:
        return "\n".join(f"[{i}] {f}" for i, f in enumerate(facts))
    return "\n".join(f"- {f}" for f in facts)


def planner_synth_user(record: QARecord) -> str:
    return (
        f"Question: {record.question}\nAnswer: {record.answer}\n"
        f"Supporting evidence:\n{_facts_block(record.golden_facts, numbered=False)}"
    )


def executor_answer_user(question: str, golden: Sequence[str]) -> str:
    return f"Question: {question}\nEvidence:\n{_facts_block(golden, numbered=False)}"


def executor_synth_user(question: str, pool: Sequence[str], answer: str, golden_positions: Sequence[int]) -> str:
    golden_lines = "\n".join(f"[{i}] {pool[i]}" for i in golden_positions)
    return f"{executor_user(question, pool)}\nAnswer: {answer}\nGolden evidence:\n{golden_lines}"


def _shuffled_pool(record: QARecord, question: str, seed: int) -> list[str]:
    # Seeded by record and sub-question so a resumed run rebuilds identical prompts (cache hits).
    digest = hashlib.sha256(f"{seed}\x00{record.id}\x00{question}".encode()).digest()
    pool = list(dict.fromkeys(record.facts))
    random.Random(int.from_bytes(digest[:8], "little")).shuffle(pool)
    return pool


def answer_matches(prediction: str, golds: Sequence[str], min_f1: float) -> tuple[bool, float, float]:
    em = exact_match(prediction, list(golds))
    f1 = f1_score(prediction, list(golds))
    return (em == 1.0 or f1 >= min_f1), em, f1


class Synthesizer:
    """Runs the planner/executor synthesis for records against one teacher."""

    def __init__(self, teacher: Teacher, selector: EvidenceSelector, config: SynthesisConfig | None = None):
        self.teacher = teacher
        self.selector = selector
        self.config = config or SynthesisConfig()
        steps = ("planner_synth", "executor_answer", "executor_synth")
        prompts, count = self.config.prompts, self.config.demonstrations
        # Loaded once, here: a bad prompt or demonstrations file fails before the first request.
        self._opening = {
            w: [{"role": "system", "content": prompts.text(w)}, *prompts.demonstrations(w, count)] for w in steps
        }
        self._selector_lock = asyncio.Lock()

    async def _ask(self, step: str, user_and_turns: list[Message]) -> str:
        """The teacher's reply for one step: its system prompt, its demonstrations, then this record's turns."""
        try:
            return await self.teacher.chat([*self._opening[step], *user_and_turns])
        except TeacherError as err:
            raise _Reject("teacher_error", str(err)) from err

    async def _select(self, answer_sentence: str, golden: list[str]):
        # One encoder, CPU bound: run it off the event loop, one call at a time.
        async with self._selector_lock:
            return await asyncio.to_thread(self.selector.select, answer_sentence, golden)

    async def execute(self, record: QARecord, question: str) -> SubQuestion:
        golden = record.golden_facts
        reply = await self._ask(
            "executor_answer", [{"role": "user", "content": executor_answer_user(question, golden)}]
        )
        answer_sentence = parse_answer_sentence(reply)
        if isinstance(answer_sentence, Malformed):
            raise _Reject(answer_sentence.reason, f"{question!r}: {answer_sentence.detail}")
        selection = await self._select(answer_sentence, golden)
        chosen = [golden[i] for i in selection.indices]
        pool = _shuffled_pool(record, question, self.config.seed)
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
        return SubQuestion(
            question=question,
            answer_sentence=answer_sentence,
            golden=chosen,
            golden_scores=list(selection.scores),
            fallback=selection.fallback,
            pool=pool,
            golden_positions=positions,
            step=step,
        )

    async def _run(self, record: QARecord) -> Trajectory:
        dialogue: list[Message] = [{"role": "user", "content": planner_synth_user(record)}]
        turns: list[dict] = []
        subquestions: list[list[SubQuestion]] = []
        searches_made = 0
        for _ in range(self.config.max_steps):
            turn = parse_planner_turn(await self._ask("planner_synth", dialogue))
            if isinstance(turn, Malformed):
                raise _Reject(turn.reason, turn.detail)
            text = render_planner_turn(turn)
            turns.append({"think": turn.think, "searches": list(turn.searches), "answer": turn.answer, "text": text})
            if turn.is_final:
                ok, em, f1 = answer_matches(turn.answer or "", record.answers, self.config.min_f1)
                if not ok:
                    raise _Reject("answer_mismatch", f"{turn.answer!r} vs {list(record.answers)} (F1 {f1:.2f})")
                if not subquestions:
                    raise _Reject("planner_no_search", "answered without any search")
                return Trajectory(record, turns, subquestions, turn.answer or "", em, f1)
            searches_made += len(turn.searches)
            if searches_made > self.config.max_searches:
                raise _Reject("planner_too_many_searches", f"{searches_made} > {self.config.max_searches}")
            outcomes = await asyncio.gather(*(self.execute(record, q) for q in turn.searches), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            executed: list[SubQuestion] = list(outcomes)  # type: ignore[arg-type]
            subquestions.append(executed)
            dialogue.append({"role": "assistant", "content": text})
            dialogue.append({"role": "user", "content": observation_text([s.observation for s in executed])})
        raise _Reject("planner_max_steps", f"no answer after {self.config.max_steps} turns")

    async def synthesize_record(self, record: QARecord) -> Trajectory | Rejection:
        try:
            return await self._run(record)
        except _Reject as rej:
            logger.info("rejected %s: %s %s", record.id, rej.reason, rej.detail)
            return Rejection(record, rej.reason, rej.detail)
        except Exception as err:  # a bug or an unexpected reply shape must cost one record, not the run
            logger.exception("unexpected error on record %s", record.id)
            return Rejection(record, "internal_error", f"{type(err).__name__}: {err}")

    async def synthesize(
        self,
        records: Sequence[QARecord],
        max_in_flight: int = 16,
        on_result: Callable[[Trajectory | Rejection], None] | None = None,
    ) -> list[Trajectory | Rejection]:
        """All records, at most ``max_in_flight`` at a time; results in input order."""
        gate = asyncio.Semaphore(max(1, max_in_flight))

        async def one(record: QARecord) -> Trajectory | Rejection:
            async with gate:
                result = await self.synthesize_record(record)
            if on_result is not None:
                on_result(result)
            return result

        return list(await asyncio.gather(*(one(r) for r in records)))


@dataclass
class Statistics:
    kept: int = 0
    rejected: Counter = field(default_factory=Counter)
    subquestions: int = 0
    selection_fallbacks: int = 0

    def add(self, result: Trajectory | Rejection) -> None:
        if isinstance(result, Rejection):
            self.rejected[result.reason] += 1
            return
        self.kept += 1
        for step in result.subquestions:
            self.subquestions += len(step)
            self.selection_fallbacks += sum(1 for s in step if s.fallback)

    @property
    def total(self) -> int:
        return self.kept + sum(self.rejected.values())

    def as_dict(self) -> dict:
        return {
            "total": self.total,
            "kept": self.kept,
            "rejected": dict(self.rejected.most_common()),
            "subquestions": self.subquestions,
            "selection_fallbacks": self.selection_fallbacks,
        }
