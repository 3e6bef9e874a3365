"""Fixtures: an OpenAI-compatible chat server on 127.0.0.1 (FastAPI + uvicorn) and a small QA set.

The server answers ``POST /v1/chat/completions`` with whatever its current
``backend`` callable returns for the request's messages: a scripted teacher
(exact replies, for protocol tests) or a tiny random HF model (garbage, for the
rejection paths). It counts requests and can fail or stall on demand.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable

import pytest
from http_servers import ThreadedUvicorn
from pydantic import BaseModel

from verl_evidence.evipath.demonstrations import load_demonstrations
from verl_evidence.prompts import load_prompt


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    model: str
    messages: list[ChatMessage]
    temperature: float | None = None
    max_tokens: int | None = None


Backend = Callable[[list[dict]], str]


class ChatServer:
    def __init__(self) -> None:
        from fastapi import FastAPI

        self.backend: Backend = lambda messages: ""
        self.requests = 0
        self.fail_statuses: list[int] = []  # popped one per request: answer with that HTTP status
        self.stall_after: int | None = None  # requests beyond this number hang until released
        self.delay = 0.0  # seconds each reply waits, so concurrent requests overlap
        self.in_flight = 0
        self.max_in_flight = 0
        self.release = threading.Event()
        self.stalled = threading.Event()
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: ChatRequest):
            from fastapi.responses import JSONResponse

            with self.lock:
                if self.fail_statuses:
                    status = self.fail_statuses.pop(0)
                    return JSONResponse({"error": {"message": f"scripted {status}"}}, status_code=status)
                self.requests += 1
                number = self.requests
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                return await self._reply(request, number)
            finally:
                with self.lock:
                    self.in_flight -= 1

        self._app = app
        self._http: ThreadedUvicorn | None = None

    async def _reply(self, request: ChatRequest, number: int) -> dict:
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.stall_after is not None and number > self.stall_after:
            release = self.release  # reset() installs a fresh event; this request waits on its own
            self.stalled.set()
            while not release.is_set():
                await asyncio.sleep(0.02)
        messages = [m.model_dump() for m in request.messages]
        content = await asyncio.to_thread(self.backend, messages)
        prompt_tokens = sum(len(m["content"].split()) for m in messages)
        return {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(content.split()),
                "total_tokens": prompt_tokens + len(content.split()),
            },
        }

    @property
    def base_url(self) -> str:
        return f"{self._http.url}/v1"

    def start(self) -> None:
        # Binds its socket before serving (no window for another server to take the port); start-up has a deadline.
        self._http = ThreadedUvicorn(self._app)

    def reset(self, backend: Backend) -> None:
        with self.lock:
            self.backend = backend
            self.requests = 0
            self.fail_statuses = []
            self.stall_after = None
            self.delay = 0.0
            self.max_in_flight = 0
            self.release = threading.Event()
            self.stalled.clear()

    def stop(self) -> None:
        self.release.set()
        self._http.stop()


@pytest.fixture(scope="module")
def chat_server():
    server = ChatServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def selector():
    from verl_evidence.evipath.evidence import EvidenceSelector

    return EvidenceSelector(tau=0.9)


# ---------------------------------------------------------------------------
# A small HotpotQA-layout set and the scripted teacher that knows how to solve it
# ---------------------------------------------------------------------------

HOTPOT_ROWS = [
    {
        "_id": "collegian",
        "question": "When was the institute that owns The Collegian founded?",
        "answer": "1960",
        "context": [
            [
                "The Collegian",
                [
                    "The Collegian is the student newspaper of Houston Baptist University.",
                    "It appears every two weeks.",
                ],
            ],
            [
                "Houston Baptist University",
                [
                    "Houston Baptist University is a private university in Houston, Texas.",
                    "Houston Baptist University was founded in 1960.",
                ],
            ],
            [
                "Glamour (magazine)",
                ["Glamour is a women's magazine published by Condé Nast.", "Glamour was founded in 1939."],
            ],
        ],
        "supporting_facts": [["The Collegian", 0], ["Houston Baptist University", 1]],
    },
    {
        "_id": "directors",
        "question": "Which film has the director born earlier, Ek Paheli or When Father Was Away On Business?",
        "answer": "Ek Paheli",
        "context": [
            ["Ek Paheli", ["Ek Paheli is a 1971 Hindi film directed by Naresh Kumar."]],
            [
                "When Father Was Away on Business",
                ["When Father Was Away on Business is a 1985 film directed by Emir Kusturica."],
            ],
            ["Naresh Kumar", ["Naresh Kumar was born on 22 December 1928."]],
            ["Emir Kusturica", ["Emir Kusturica was born on 24 November 1954."]],
            ["Salt to the Sea", ["Salt to the Sea is a 2016 novel by Ruta Sepetys."]],
        ],
        "supporting_facts": [
            ["Ek Paheli", 0],
            ["When Father Was Away on Business", 0],
            ["Naresh Kumar", 0],
            ["Emir Kusturica", 0],
        ],
    },
    {
        "_id": "wrong",
        "question": "Who founded the magazine Glamour?",
        "answer": "Condé Nast",
        "context": [
            [
                "Glamour (magazine)",
                ["Glamour is a women's magazine published by Condé Nast.", "Glamour was founded in 1939."],
            ]
        ],
        "supporting_facts": [["Glamour (magazine)", 0]],
    },
]

# Planner turns per question; observations come from the executor side.
PLANNER_SCRIPT = {
    "collegian": [
        (
            "<think>\nPlan:\n1. Find the institute that owns The Collegian.\n2. Find when that institute was founded.\n"
            'I start with the owner.\n</think>\n<action>\nSearch("Which institute owns The Collegian?")\n</action>'
        ),
        (
            "<think>\nThe Collegian belongs to Houston Baptist University; now its founding year.\n</think>\n"
            '<action> Search("When was Houston Baptist University founded?") </action>'
        ),
        (
            "<think>\nHouston Baptist University was founded in 1960, which answers the question.\n"
            "</think>\n<answer> 1960 </answer>"
        ),
    ],
    "directors": [
        (
            "<think>\nPlan: find both directors, then both birth dates, then compare.\n</think>\n<action>\n"
            'Search("Who directed Ek Paheli?")\nSearch("Who directed When Father Was Away on Business?")\n</action>'
        ),
        (
            "<think>\nThe directors are Naresh Kumar and Emir Kusturica; now their birth dates.\n</think>\n<action>\n"
            'Search("When was Naresh Kumar born?")\nSearch("When was Emir Kusturica born?")\n</action>'
        ),
        (
            "<think>\nNaresh Kumar (1928) was born before Emir Kusturica (1954), so Ek Paheli.\n"
            "</think\n<answer> Ek Paheli </answer>"
        ),
    ],
    "wrong": [
        '<think>\nI need the founder of Glamour.\n</think>\n<action>\nSearch("Who publishes Glamour?")\n</action>',
        "<think>\nThe evidence names the publisher.\n</think>\n<answer> Ruta Sepetys </answer>",
    ],
}

EXECUTOR_ANSWERS = {
    "Which institute owns The Collegian?": "The Collegian is the student newspaper of Houston Baptist University.",
    "When was Houston Baptist University founded?": "Houston Baptist University was founded in 1960.",
    "Who directed Ek Paheli?": "Ek Paheli was directed by Naresh Kumar.",
    "Who directed When Father Was Away on Business?": (
        "When Father Was Away on Business was directed by Emir Kusturica."
    ),
    "When was Naresh Kumar born?": "Naresh Kumar was born on 22 December 1928.",
    "When was Emir Kusturica born?": "Emir Kusturica was born on 24 November 1954.",
    "Who publishes Glamour?": "Glamour is published by Condé Nast.",
}


def _field(text: str, name: str) -> str:
    match = re.search(rf"^{name}: (.*)$", text, flags=re.MULTILINE)
    assert match, f"{name} missing from prompt:\n{text}"
    return match.group(1).strip()


class ScriptedTeacher:
    """Replies like a competent teacher would, chosen by which system prompt is asking."""

    def __init__(self, planner_overrides: dict[str, list[str]] | None = None, select_override: str | None = None):
        self.planner = {**PLANNER_SCRIPT, **(planner_overrides or {})}
        self.select_override = select_override
        self.system = {
            name: load_prompt(name).strip()
            for name in ("evipath_planner_synth", "evipath_executor_answer", "evipath_executor_synth")
        }
        self.by_question = {row["question"]: row["_id"] for row in HOTPOT_ROWS}
        self.demonstration_texts = {
            message["content"]
            for name in ("evipath_planner_synth_demos", "evipath_executor_synth_demos")
            for demonstration in load_demonstrations(name)
            for message in demonstration
        }

    def record_turns(self, messages: list[dict]) -> list[dict]:
        """The messages about the record at hand: after the system prompt and the packaged demonstrations."""
        turns = messages[1:]
        while turns and turns[0]["content"] in self.demonstration_texts:
            turns = turns[1:]
        return turns

    def __call__(self, messages: list[dict]) -> str:
        turns = self.record_turns(messages)
        system, user = messages[0]["content"], turns[0]["content"]
        if system == self.system["evipath_planner_synth"]:
            record_id = self.by_question[_field(user, "Question")]
            turn = sum(1 for m in turns if m["role"] == "assistant")
            return self.planner[record_id][turn]
        if system == self.system["evipath_executor_answer"]:
            return f"<answer> {EXECUTOR_ANSWERS[_field(user, 'Question')]} </answer>"
        if system == self.system["evipath_executor_synth"]:
            golden = re.findall(r"^\[(\d+)\]", user.split("Golden evidence:")[1], flags=re.MULTILINE)
            select = self.select_override or "[" + ", ".join(golden) + "]"
            answer = _field(user, "Answer")
            return (
                f"<think> The question asks: {_field(user, 'Question')} Evidence [{golden[0]}] states it. </think>\n"
                f"<select>{select}</select>\n<answer> {answer} </answer>"
            )
        raise AssertionError(f"unexpected system prompt: {system[:80]}")


@pytest.fixture(scope="session")
def hotpot_records():
    from verl_evidence.evipath.records import iter_records

    return list(iter_records(HOTPOT_ROWS, "hotpotqa"))


@pytest.fixture(scope="session")
def scripted():
    """The ScriptedTeacher class (a fixture, so test modules need no package imports)."""
    return ScriptedTeacher
