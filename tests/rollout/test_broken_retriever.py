"""A run does not train on a broken retriever: when most searches of a step fail, the rollout raises.

A port on 127.0.0.1 that refuses connections stands for the broken server; the loops run through
verl's AgentLoopWorker as in training, the global step coming with each generation as verl's
server sends it.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest
from rollout_helpers import make_row, run_worker, unpad, with_settings

from verl_evidence.local.backends import ScriptedBackend
from verl_evidence.tools.search_service import RetrievalBrokenError, step_searches

pytestmark = pytest.mark.slow

QUESTION = "Which river is the longest in Africa?"


@pytest.fixture
def refused_url() -> Iterator[str]:
    with socket.socket() as sock:  # bound, never listening: every connection is refused
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def search_backend(tokenizer, step: int = 0) -> ScriptedBackend:
    def respond(prompt: str) -> str:
        return "<answer> Nile </answer>" if "<information>" in prompt else "<search> longest river </search>"

    backend = ScriptedBackend(tokenizer, responder=respond)
    backend.global_steps = step
    return backend


def loop_config(base_config, loop: str, url: str, **settings):
    custom = {"retrieval_url": url, "search_max_retries": 0, "search_timeout": 2.0, **settings}
    return with_settings(base_config, {"actor_rollout_ref.rollout.custom": {loop: custom}})


def test_search_loop_stops_when_most_searches_of_a_step_fail(base_config, tokenizer, refused_url):
    config = loop_config(base_config, "evidence_search", refused_url)
    rows = [make_row(QUESTION, "evidence_search") for _ in range(8)]  # the default minimum: 8 searches
    with pytest.raises(RetrievalBrokenError) as info:
        run_worker(config, search_backend(tokenizer, step=3), rows)
    message = str(info.value)
    assert refused_url in message and "training step 3" in message
    assert re.search(r"failed 8 of 8 searches .*last failure: RetrievalUnavailableError: .*ConnectError", message)


def test_failures_below_the_minimum_are_observations_and_counted(base_config, tokenizer, refused_url):
    config = loop_config(base_config, "evidence_search", refused_url)
    output = run_worker(config, search_backend(tokenizer, step=1), [make_row(QUESTION, "evidence_search")] * 3)
    for row in range(3):
        extra = unpad(output, row)["extra"]
        assert extra["search_errors"] == 1 and extra["num_searches"] == 1 and extra["termination"] == "answer"
    assert step_searches(refused_url, 1) == (3, 3)


def test_threshold_and_minimum_are_settings_and_steps_count_apart(base_config, tokenizer, refused_url):
    config = loop_config(
        base_config, "evidence_search", refused_url, search_failure_min_searches=2, search_failure_threshold=0.5
    )
    row = [make_row(QUESTION, "evidence_search")]
    run_worker(config, search_backend(tokenizer, step=5), row)  # 1 search of step 5: below the minimum
    run_worker(config, search_backend(tokenizer, step=6), row)  # step 6 counts on its own
    assert step_searches(refused_url, 5) == (1, 1) and step_searches(refused_url, 6) == (1, 1)
    with pytest.raises(RetrievalBrokenError, match="failed 2 of 2 searches of training step 6"):
        run_worker(config, search_backend(tokenizer, step=6), row)
    never = loop_config(base_config, "evidence_search", refused_url, search_failure_threshold=1.0)
    run_worker(never, search_backend(tokenizer, step=7), row * 8)  # 1: never stops
    assert step_searches(refused_url, 7) == (8, 8)


def test_eviomni_loop_stops_on_a_broken_server(base_config, tokenizer, refused_url):
    config = loop_config(base_config, "eviomni", refused_url, search_failure_min_searches=3)
    backend = ScriptedBackend(tokenizer, responder=lambda prompt: "<answer> Nile </answer>")
    backend.global_steps = 2
    rows = [make_row(QUESTION, "eviomni") for _ in range(2)]  # no passages in the rows: the loop searches
    output = run_worker(config, backend, rows)
    assert [unpad(output, r)["extra"]["retrieval_failed"] for r in range(2)] == [1.0, 1.0]
    with pytest.raises(RetrievalBrokenError, match=rf"{re.escape(refused_url)} failed 3 of 3 searches"):
        run_worker(config, backend, rows)
