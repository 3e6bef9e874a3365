"""EviPath's knowledge-graph planner form (Table 8; 2Wiki-KG and QALD-10 over Wikidata).

In the KG form the planner names the entity each sub-question starts from: the question comes with numbered
candidate entities (``Candidate: [0] Ek Paheli, [1] When Father Was Away On Business``), each search is
``Search([i], "sub-question")`` and each observation sentence brings its answer's entities in as new candidates
(``Candidate: [2] Naresh Kumar``), numbered on from the last. The executor reads the chosen entity's facts as
numbered triples ``(subject, property, object)`` (Table 9).

This module holds the layout (rendering and parsing; parsers never raise on model text, they return
:class:`~verl_evidence.evipath.parsing.Malformed`) and the graph behind it as an interface:
:class:`KnowledgeGraph`. :class:`TripleStore` serves triples held in memory (2Wiki's evidence triples, tests);
:class:`WikidataGraph` is the skeleton a user fills with calls to Wikidata's API (this project makes none).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from verl_evidence.agent_loops.protocol import SEARCH_WORD, unquote
from verl_evidence.evipath.parsing import Malformed
from verl_evidence.text.tags import extract_last, find_blocks, strip_thinking

__all__ = [
    "Candidates",
    "KGPlannerTurn",
    "KGSearch",
    "KnowledgeGraph",
    "Triple",
    "TripleStore",
    "WikidataGraph",
    "executor_evidence",
    "kg_search_calls",
    "listed_candidates",
    "observation_message",
    "parse_kg_planner_turn",
    "question_message",
    "render_kg_turn",
]

KG_SEARCH_CALL = re.compile(
    r"""Search\(\s*\[\s*(?P<entity>\d+)\s*\]\s*,\s*(?P<q>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*\)""",
)


class Triple(NamedTuple):
    subject: str
    relation: str
    object: str

    def text(self) -> str:
        return f"({self.subject}, {self.relation}, {self.object})"


@dataclass(frozen=True)
class KGSearch:
    entity: int  # the candidate index the sub-question starts from
    question: str


@dataclass(frozen=True)
class KGPlannerTurn:
    think: str
    searches: tuple[KGSearch, ...] = ()
    answer: str | None = None

    @property
    def is_final(self) -> bool:
        return self.answer is not None


@dataclass
class Candidates:
    """The numbered entities of one dialogue: the question's first, then each observation's, never renumbered."""

    names: list[str] = field(default_factory=list)

    def add(self, names: Iterable[str]) -> list[int]:
        """Indices of ``names``, numbering the new ones on from the last (a known name keeps its index)."""
        indices = []
        for name in names:
            name = " ".join(str(name).split())
            if not name:
                continue
            if name not in self.names:
                self.names.append(name)
            indices.append(self.names.index(name))
        return indices

    def name(self, index: int) -> str | None:
        return self.names[index] if 0 <= index < len(self.names) else None

    def listing(self, indices: Sequence[int]) -> str:
        """``Candidate: [0] A, [1] B`` ("" for none)."""
        if not indices:
            return ""
        return "Candidate: " + ", ".join(f"[{i}] {self.names[i]}" for i in indices)


def question_message(
    question: str,
    candidates: Candidates,
    entities: Sequence[str],
    answer: str | None = None,
    evidence: Sequence[Triple] = (),
) -> str:
    """The planner's user turn: the question with its candidate entities (synthesis also shows the answer and the
    supporting triples first, as Table 8's teacher sees them)."""
    listing = candidates.listing(candidates.add(entities))
    lines = []
    if answer is not None:
        lines += [f"Question: {question}", f"Answer: {answer}", "Supporting evidences:"]
        lines += [triple.text() for triple in evidence]
    lines.append(f"Question: {question} {listing}".rstrip())
    if answer is not None:
        lines.append(f"Answer: {answer}")
    return "\n".join(lines)


def observation_message(results: Sequence[tuple[str, Sequence[str]]], candidates: Candidates) -> str:
    """``Observation:`` then one line per search: its answer sentence and the entities it brings in as candidates."""
    lines = ["Observation:"]
    for sentence, entities in results:
        listing = candidates.listing(candidates.add(entities))
        lines.append(f"{' '.join(sentence.split())} {listing}".rstrip())
    return "\n".join(lines)


_LISTED = re.compile(r"\[(\d+)\]\s*(.+?)\s*(?=,\s*\[\d+\]|$)")


def listed_candidates(message: str) -> list[tuple[int, str]]:
    """``(index, name)`` of every ``Candidate: [i] Name, ...`` listing in a user message, in order."""
    found = []
    for line in message.splitlines():
        _, sep, listing = line.partition("Candidate: ")
        if sep:
            found += [(int(m[1]), m[2]) for m in _LISTED.finditer(listing.strip())]
    return found


def kg_search_calls(text: str) -> list[KGSearch] | Malformed:
    """Every ``Search([i], "…")`` of ``text`` in order; a ``Search(`` without an entity index is malformed."""
    calls = [KGSearch(int(m["entity"]), unquote(m["q"])) for m in KG_SEARCH_CALL.finditer(text)]
    if len(SEARCH_WORD.findall(text)) != len(calls):
        return Malformed("search_without_entity", text.strip()[:200])
    if any(not call.question for call in calls):
        return Malformed("empty_search")
    return calls


def parse_kg_planner_turn(text: str, candidates: Candidates) -> KGPlannerTurn | Malformed:
    """One planner turn of the KG form: think, then an ``<action>`` of ``Search([i], "q")`` calls or an answer.

    Every entity index must name a candidate listed so far (``unknown_candidate`` otherwise).
    """
    if not isinstance(text, str):
        return Malformed("not_text")
    thoughts = find_blocks(text, "think")
    think = thoughts[0] if thoughts else ""
    answer = extract_last(strip_thinking(text), "answer")
    actions = find_blocks(text, "action")
    if answer is not None and not actions:
        return KGPlannerTurn(think, answer=answer.strip())
    if not actions:
        return Malformed("no_action", text.strip()[:200])
    calls = kg_search_calls(actions[0])
    if isinstance(calls, Malformed):
        return calls
    if not calls:
        return Malformed("no_search_in_action", actions[0][:200])
    unknown = [call.entity for call in calls if candidates.name(call.entity) is None]
    if unknown:
        return Malformed("unknown_candidate", f"indices {unknown}; candidates 0-{len(candidates.names) - 1}")
    return KGPlannerTurn(think, searches=tuple(calls))


def render_kg_turn(turn: KGPlannerTurn) -> str:
    """A parsed turn in the canonical layout (what the fine-tuning data stores)."""
    head = f"<think>\n{turn.think}\n</think>\n"
    if turn.is_final:
        return head + f"<answer> {turn.answer} </answer>"
    calls = "\n".join(f'Search([{s.entity}], "{s.question}")' for s in turn.searches)
    return head + f"<action>\n{calls}\n</action>"


def executor_evidence(question: str, triples: Sequence[Triple]) -> str:
    """The executor's input in the KG form: the sub-question and the entity's facts as numbered triples."""
    numbered = "\n".join(f"[{i}] {triple.text()}" for i, triple in enumerate(triples))
    return f"Question: {question}\nSupporting evidence:\n{numbered}"


class KnowledgeGraph(Protocol):
    """What the KG form needs of a graph: an entity's facts by its name (the candidates are names)."""

    def facts(self, entity: str) -> list[Triple]:
        """Every fact whose subject is ``entity`` (and, as Table 9 shows, facts pointing at it)."""
        ...


class TripleStore:
    """A graph held in memory: 2Wiki's evidence triples, or any list of (subject, relation, object)."""

    def __init__(self, triples: Iterable[Sequence[str]]) -> None:
        self.triples = [Triple(*(" ".join(str(part).split()) for part in t)) for t in triples]
        for triple in self.triples:
            if not all(triple):
                raise ValueError(f"a triple needs a subject, a relation and an object, got {triple}")

    def facts(self, entity: str) -> list[Triple]:
        key = " ".join(entity.split()).casefold()
        own = [t for t in self.triples if t.subject.casefold() == key]
        pointing = [t for t in self.triples if t.object.casefold() == key and t.subject.casefold() != key]
        return own + pointing


class WikidataGraph:
    """Wikidata behind :class:`KnowledgeGraph`: fill :meth:`facts` with your calls (the paper used Wikidata's
    official APIs; this project makes no network calls and ships none).

    A filling resolves the name to an item (``wbsearchentities``), reads its claims (``wbgetentities`` or a SPARQL
    query) and returns them as labelled triples; cache the answers, as a synthesis run asks for the same entities
    many times.
    """

    def facts(self, entity: str) -> list[Triple]:
        raise NotImplementedError(
            "WikidataGraph.facts is for you to fill with Wikidata API calls (see its docstring); "
            "or pass a TripleStore of the data set's own triples"
        )
