"""The ``search`` tool against the real retrieval server, directly and through verl's ToolAgentLoop."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from rollout_helpers import make_row, run_worker, unpad, with_settings

import verl_evidence
from retrieval_server.client import RetrievalClient
from retrieval_server.haproxy_front import free_port
from verl_evidence.local.backends import ScriptedBackend
from verl_evidence.tools.search_service import RateLimiter, shared_rate_limiter
from verl_evidence.tools.search_settings import SearchSettings
from verl_evidence.tools.search_tool import SearchTool

# Tests that use `search_url` (the session's Ray Serve retrieval server) or verl's agent loop are `slow`;
# the rate limiter and a down server need neither.

PACKAGED_YAML = Path(verl_evidence.__file__).parent / "configs" / "search_tool.yaml"


def tool_from_packaged_yaml(url: str, **config) -> SearchTool:
    """The tool exactly as verl builds it from our YAML (same loader, same schema)."""
    from verl.tools.tool_registry import initialize_tools_from_config

    spec = OmegaConf.load(PACKAGED_YAML)
    spec.tools[0].config.retrieval_url = url
    for key, value in config.items():
        spec.tools[0].config[key] = value
    with tempfile.TemporaryDirectory() as directory:  # read once, here: nothing left in /tmp
        path = Path(directory) / "search_tool.yaml"
        OmegaConf.save(spec, path)
        (tool,) = initialize_tools_from_config(str(path))
    return tool


def execute(tool: SearchTool, parameters) -> tuple[str, dict]:
    async def go():
        instance_id, _ = await tool.create()
        response, reward, metrics = await tool.execute(instance_id, parameters)
        await tool.release(instance_id)
        assert reward == 0.0
        return response.text, metrics

    return asyncio.run(go())


@pytest.mark.slow
def test_formats_documents_of_the_real_server(search_url):
    tool = tool_from_packaged_yaml(search_url)
    assert tool.name == "search"
    text, metrics = execute(tool, {"query_list": ["longest river in Africa"]})
    direct = RetrievalClient(search_url).retrieve(["longest river in Africa"], topk=3)[0]
    lines = text.split("\n")
    assert len(lines) == 3
    for index, (line, item) in enumerate(zip(lines, direct, strict=True), start=1):
        title, body = item["document"]["contents"].split("\n", 1)
        assert line == f"Doc {index} (Title: {title}) {body}"
    assert metrics["retrieved_ids"] == [[d["document"]["id"] for d in direct]]


@pytest.mark.slow
def test_several_queries_get_one_block_each(search_url):
    text, metrics = execute(tool_from_packaged_yaml(search_url), {"query_list": ["Nile", "Mount Everest"]})
    assert text.startswith("Results for 'Nile':\nDoc 1 (Title: ")
    assert "\n\nResults for 'Mount Everest':\nDoc 1 (Title: " in text
    assert metrics["num_queries"] == 2 and len(metrics["retrieved_ids"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "parameters, message",
    [
        ({}, "`query_list` must be a non-empty list"),
        ({"query_list": []}, "`query_list` must be a non-empty list"),
        ({"query_list": [3]}, "every entry of `query_list` must be a non-empty string"),
        ({"query_list": ["a", "b", "c", "d"]}, "at most 3 queries per call"),
        ("not a dict", "arguments must be a JSON object"),
    ],
)
def test_malformed_arguments_return_an_error_text(search_url, parameters, message):
    text, metrics = execute(tool_from_packaged_yaml(search_url), parameters)
    assert text.startswith("Search error:") and message in text
    assert metrics == {"error": "bad_arguments"}


@pytest.mark.slow
def test_request_rejected_by_the_server_is_reported(search_url):
    text, metrics = execute(tool_from_packaged_yaml(search_url), {"query_list": ["x" * 5000]})
    assert text.startswith("Search error: the request was rejected (")
    assert metrics == {"error": "rejected"}


def test_server_down_is_reported_not_raised():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    tool = tool_from_packaged_yaml(url, max_retries=1, backoff=0.01, retry_deadline_s=0)
    text, metrics = execute(tool, {"query_list": ["Nile"]})
    assert "search engine is unavailable" in text
    assert metrics == {"error": "unavailable"}


def test_rate_limiter_is_shared_per_server_and_limits_and_bounds_concurrency():
    async def go():
        a = shared_rate_limiter(SearchSettings(retrieval_url="http://x", max_concurrency=2))
        assert shared_rate_limiter(SearchSettings(retrieval_url="http://x", max_concurrency=2, topk=7)) is a
        assert shared_rate_limiter(SearchSettings(retrieval_url="http://y", max_concurrency=2)) is not a
        active, peak = 0, 0

        async def request():
            nonlocal active, peak
            async with a:
                active += 1
                peak = max(peak, active)
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                active -= 1

        await asyncio.gather(*(request() for _ in range(8)))
        return peak

    assert asyncio.run(go()) == 2


def test_same_url_with_other_limits_gets_its_own_limiter():
    # Two loops on one server: whichever searched first used to set the limits for both.
    async def go():
        slow = shared_rate_limiter(SearchSettings(retrieval_url="http://x", requests_per_second=1.0))
        fast = shared_rate_limiter(SearchSettings(retrieval_url="http://x", requests_per_second=50.0))
        narrow = shared_rate_limiter(SearchSettings(retrieval_url="http://x", max_concurrency=1))
        wide = shared_rate_limiter(SearchSettings(retrieval_url="http://x"))
        return slow, fast, narrow, wide

    slow, fast, narrow, wide = asyncio.run(go())
    assert len({id(slow), id(fast), id(narrow), id(wide)}) == 4
    assert (slow.rate, fast.rate, narrow.rate, wide.rate) == (1.0, 50.0, None, None)
    assert (narrow.semaphore._value, wide.semaphore._value) == (1, 64)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when it would wait: each wait is skipped and recorded.

    aiolimiter times its bucket with ``loop.time()``, so the bucket's waits are checked exactly,
    without real time. (Hand-written: a dozen lines, where a fake-time plugin would change how
    every async test of the suite runs.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = 100.0
        self.waits: list[float] = []
        real_select = self._selector.select

        def select(timeout=None):
            if timeout:  # the next timer is `timeout` ahead: jump there
                self.waits.append(round(timeout, 9))
                self.now += timeout
            return real_select(0)

        self._selector.select = select

    def time(self) -> float:
        return self.now


def run_virtual(coroutine_fn):
    loop = VirtualTimeLoop()
    try:
        return loop, loop.run_until_complete(coroutine_fn(loop))
    finally:
        loop.close()


def test_rate_limit_spends_the_burst_then_waits_exactly_for_a_refill():
    async def go(loop):
        limiter = RateLimiter(max_concurrency=8, rate=2.0, burst=2)
        entered = []
        for _ in range(2):  # the burst: no wait
            async with limiter:
                entered.append(loop.time())
        async with limiter:  # bucket full: one request takes 1 / rate = 0.5 s
            entered.append(loop.time())
        loop.now += 0.25  # half a request drained while idle: the next caller waits only for the rest
        async with limiter:
            entered.append(loop.time())
        loop.now += 60.0  # a long idle empties the bucket to the burst, never beyond it
        for _ in range(3):
            async with limiter:
                entered.append(loop.time())
        return [round(t - 100.0, 6) for t in entered]

    loop, entered = run_virtual(go)
    assert entered == [0.0, 0.0, 0.5, 1.0, 61.0, 61.0, 61.5]
    assert loop.waits == [0.5, 0.25, 0.5]


def test_rate_limit_spaces_concurrent_callers_at_the_rate():
    async def go(loop):
        limiter = RateLimiter(max_concurrency=8, rate=4.0, burst=1)
        entered: list[float] = []

        async def request():
            async with limiter:
                entered.append(round(loop.time() - 100.0, 6))

        await asyncio.gather(*(request() for _ in range(4)))
        return entered

    loop, entered = run_virtual(go)
    assert entered == [0.0, 0.25, 0.5, 0.75]
    assert loop.waits == [0.25, 0.25, 0.25]


def test_unlimited_rate_never_waits():
    async def go(loop):
        limiter = RateLimiter(max_concurrency=8, rate=None)
        for _ in range(100):
            async with limiter:
                pass

    loop, _ = run_virtual(go)
    assert loop.waits == []


def test_unknown_tool_config_key_fails_naming_it():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="requests_per_secnd"):
        SearchTool({"retrieval_url": "http://x", "requests_per_secnd": 2})


def test_the_loops_failure_thresholds_are_refused_by_the_tool_not_ignored():
    with pytest.raises(ValueError, match=r"\['failure_threshold'\] only apply to this project's agent loops"):
        SearchTool({"retrieval_url": "http://x", "failure_threshold": 0.2})


def test_the_search_settings_are_one_list_read_by_the_tool_and_both_loops():
    """Every SearchSettings field is a loop key with the same default (the token only from the environment) and a tool
    key (the loops' failure thresholds apart); a loop can set what the tool can, `burst` included."""
    import dataclasses

    from verl_evidence.agent_loops.eviomni_loop import EviOmniLoopSettings
    from verl_evidence.agent_loops.search_loop_settings import SearchLoopSettings
    from verl_evidence.tools.search_settings import LOOP_SEARCH_KEYS, TOOL_FIELDS, loop_key

    defaults = SearchSettings()
    assert set(LOOP_SEARCH_KEYS.values()) == set(SearchSettings.model_fields) - {"token"}
    assert set(TOOL_FIELDS) == set(SearchSettings.model_fields) - {"failure_threshold", "failure_min_searches"}
    for cls in (SearchLoopSettings, EviOmniLoopSettings):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in LOOP_SEARCH_KEYS.values():
            field = fields[loop_key(name)]
            if not (cls is EviOmniLoopSettings and name == "topk"):  # the EviOmni loop fetches 5 passages
                assert field.default == getattr(defaults, name), (cls.__name__, name)
    settings = SearchLoopSettings(search_burst=4, search_requests_per_second=2.0).search_settings()
    assert (settings.burst, settings.requests_per_second) == (4, 2.0)
    tool = SearchTool({"retrieval_url": "http://x", "burst": 4, "requests_per_second": 2.0})
    assert tool.service.settings.limiter_key == settings.model_copy(update={"retrieval_url": "http://x"}).limiter_key


@pytest.mark.slow
def test_verl_tool_agent_loop_drives_the_search_tool(base_config, search_url, tokenizer, tmp_path):
    spec = OmegaConf.load(PACKAGED_YAML)
    spec.tools[0].config.retrieval_url = search_url
    OmegaConf.save(spec, tmp_path / "tools.yaml")
    config = with_settings(
        base_config,
        {
            "actor_rollout_ref.rollout.multi_turn.enable": True,
            "actor_rollout_ref.rollout.multi_turn.format": "hermes",
            "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(tmp_path / "tools.yaml"),
            "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": 6144,
        },
    )
    call = {"name": "search", "arguments": {"query_list": ["longest river in Africa"]}}
    turns = [f"I will search.\n<tool_call>\n{json.dumps(call)}\n</tool_call>", "The answer is the Nile."]
    backend = ScriptedBackend(tokenizer, turns=turns)
    out = unpad(run_worker(config, backend, [make_row("Which river is the longest in Africa?", "tool_agent")]))

    direct = RetrievalClient(search_url).retrieve(["longest river in Africa"], topk=3)[0]
    tool_tokens = [t for t, m in zip(out["response_ids"], out["response_mask"], strict=True) if m == 0]
    tool_text = tokenizer.decode(tool_tokens)
    title, body = direct[0]["document"]["contents"].split("\n", 1)
    assert f"Doc 1 (Title: {title}) {body}" in tool_text  # not truncated at 6144 characters
    assert "truncated" not in tool_text
    policy_text = tokenizer.decode([t for t, m in zip(out["response_ids"], out["response_mask"], strict=True) if m])
    assert "<tool_call>" in policy_text and "The answer is the Nile." in policy_text
    assert backend.remaining_turns == 0


def _health_server_after(delay_s: float):
    """A plain HTTP server answering /health 200, listening only after ``delay_s`` (a server loading its index)."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    servers = []

    def start_later():
        time.sleep(delay_s)
        server = ThreadingHTTPServer(("127.0.0.1", port), Health)
        servers.append(server)
        server.serve_forever()

    threading.Thread(target=start_later, daemon=True).start()
    return f"http://127.0.0.1:{port}", servers


@pytest.mark.mostly_waits  # tests/scheduling.py
def test_the_first_search_waits_for_a_server_still_loading_and_later_ones_do_not():
    from verl_evidence.tools.search_service import wait_until_ready

    url, servers = _health_server_after(1.5)

    async def scenario():
        started = time.monotonic()
        # three concurrent first searches share one probe
        await asyncio.gather(*(wait_until_ready(url, wait_s=30) for _ in range(3)))
        first = time.monotonic() - started
        started = time.monotonic()
        await wait_until_ready(url, wait_s=30)
        return first, time.monotonic() - started

    try:
        first, again = asyncio.run(scenario())
    finally:
        for server in servers:
            server.shutdown()
    assert 1.5 <= first < 10
    assert again < 0.05


def test_a_server_that_never_answers_fails_the_waiting_searches_once_then_searches_go_on(monkeypatch):
    from retrieval_server.client import RetrievalUnavailableError
    from verl_evidence.tools.search_service import SearchService, wait_until_ready
    from verl_evidence.tools.search_settings import RETRIEVAL_WAIT_ENV

    url, _ = _health_server_after(3600)  # never within the test

    async def scenario():
        with pytest.raises(RetrievalUnavailableError, match=r"no retrieval server answered .*/health within 1 s"):
            await wait_until_ready(url, wait_s=1.0)
        started = time.monotonic()
        await wait_until_ready(url, wait_s=1.0)  # not held again: the client's own retries take over
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 0.05
    monkeypatch.setenv(RETRIEVAL_WAIT_ENV, "42")
    assert SearchService(url).wait_for_server_s == 42.0  # the recipes' env reaches every service
    assert SearchService(url, wait_for_server_s=0).wait_for_server_s == 0.0
