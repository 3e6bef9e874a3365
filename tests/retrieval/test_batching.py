"""BacklogBatcher on its own (asyncio, no Ray): batch failures, clients that leave, batch sizes."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from retrieval_server.batching import BacklogBatcher


class ScriptedBatches:
    """A run_batch that records every batch and holds batch i until the test calls ``finish(i)``."""

    def __init__(self, fail_batches: set[int] = frozenset(), drop_last_result: bool = False, hold: bool = True) -> None:
        self.batches: list[list[str]] = []
        self.fail_batches = fail_batches
        self.drop_last_result = drop_last_result
        self.hold = hold
        self._gates: defaultdict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self._started: defaultdict[int, asyncio.Event] = defaultdict(asyncio.Event)

    def finish(self, batch: int) -> None:
        self._gates[batch].set()

    async def started(self, batch: int) -> None:
        await asyncio.wait_for(self._started[batch].wait(), timeout=10)

    async def __call__(self, items: list[str]) -> list[str]:
        batch = len(self.batches)
        self.batches.append(list(items))
        self._started[batch].set()
        if self.hold:
            await self._gates[batch].wait()
        if batch in self.fail_batches:
            raise RuntimeError(f"batch {batch} broke")
        results = [f"result of {item}" for item in items]
        return results[:-1] if self.drop_last_result else results


async def _queued(batcher: BacklogBatcher, n: int) -> None:
    """Yield to the loop until n submissions wait in the batcher's queue."""
    for _ in range(1000):
        if batcher.queued == n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"expected {n} queued submissions, found {batcher.queued}")


def _outcome(task: asyncio.Task) -> str:
    return f"error: {task.exception()}" if task.exception() is not None else task.result()


def test_a_failed_batch_fails_exactly_its_own_requests():
    async def scenario() -> tuple[list[list[str]], dict[str, str]]:
        run = ScriptedBatches(fail_batches={1})
        batcher = BacklogBatcher(run, max_batch_size=8)
        tasks = {name: asyncio.create_task(batcher.submit(name)) for name in ("a1", "a2")}
        await run.started(0)  # batch 0 = a1, a2 (submitted together) is running
        tasks |= {name: asyncio.create_task(batcher.submit(name)) for name in ("b1", "b2", "b3")}
        await _queued(batcher, 3)
        run.finish(0)
        await run.started(1)  # batch 1 = b1..b3 is running
        tasks["c1"] = asyncio.create_task(batcher.submit("c1"))
        await _queued(batcher, 1)
        run.finish(1)  # batch 1 fails; c1, queued behind it, must still be served
        run.finish(2)
        done, pending = await asyncio.wait(tasks.values(), timeout=10)
        assert not pending
        return run.batches, {name: _outcome(task) for name, task in tasks.items()}

    batches, outcomes = asyncio.run(scenario())
    assert batches == [["a1", "a2"], ["b1", "b2", "b3"], ["c1"]]
    assert outcomes == {
        "a1": "result of a1",
        "a2": "result of a2",
        "b1": "error: batch 1 broke",
        "b2": "error: batch 1 broke",
        "b3": "error: batch 1 broke",
        "c1": "result of c1",
    }


def test_requests_whose_client_left_before_their_batch_are_skipped():
    async def scenario() -> tuple[list[list[str]], dict[str, str]]:
        run = ScriptedBatches()
        batcher = BacklogBatcher(run, max_batch_size=8)
        running = asyncio.create_task(batcher.submit("running"))
        await run.started(0)
        waiting = {name: asyncio.create_task(batcher.submit(name)) for name in ("stays", "leaves", "stays too")}
        await _queued(batcher, 3)
        waiting["leaves"].cancel()  # what Serve does to a handler whose client disconnected
        run.finish(0)
        run.finish(1)
        done, pending = await asyncio.wait([running, *waiting.values()], timeout=10)
        assert not pending
        return run.batches, {
            name: ("cancelled" if task.cancelled() else _outcome(task)) for name, task in waiting.items()
        }

    batches, outcomes = asyncio.run(scenario())
    assert batches == [["running"], ["stays", "stays too"]]
    assert outcomes == {"stays": "result of stays", "leaves": "cancelled", "stays too": "result of stays too"}


def test_a_batch_whose_every_client_left_runs_nothing():
    async def scenario() -> tuple[list[list[str]], str]:
        run = ScriptedBatches()
        batcher = BacklogBatcher(run, max_batch_size=8)
        running = asyncio.create_task(batcher.submit("running"))
        await run.started(0)
        gone = [asyncio.create_task(batcher.submit(name)) for name in ("gone 1", "gone 2")]
        await _queued(batcher, 2)
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        run.finish(0)
        run.finish(1)
        await asyncio.wait_for(running, timeout=10)
        return run.batches, await asyncio.wait_for(batcher.submit("later"), timeout=10)

    batches, later = asyncio.run(scenario())
    assert batches == [["running"], ["later"]]
    assert later == "result of later"


def test_a_client_leaving_during_its_batch_does_not_disturb_the_others():
    async def scenario() -> dict[str, str]:
        run = ScriptedBatches()
        batcher = BacklogBatcher(run, max_batch_size=8)
        tasks = {name: asyncio.create_task(batcher.submit(name)) for name in ("x", "y", "z")}
        await run.started(0)
        tasks["y"].cancel()
        run.finish(0)
        await asyncio.wait(tasks.values(), timeout=10)
        return {name: ("cancelled" if task.cancelled() else _outcome(task)) for name, task in tasks.items()}

    assert asyncio.run(scenario()) == {"x": "result of x", "y": "cancelled", "z": "result of z"}


def test_a_batch_returning_too_few_results_fails_its_requests_instead_of_leaving_them_waiting():
    async def scenario() -> dict[str, str]:
        run = ScriptedBatches(drop_last_result=True, hold=False)
        batcher = BacklogBatcher(run, max_batch_size=8)
        tasks = {name: asyncio.create_task(batcher.submit(name)) for name in ("p", "q")}
        done, pending = await asyncio.wait(tasks.values(), timeout=5)
        assert not pending, "requests left waiting forever"
        return {name: _outcome(task) for name, task in tasks.items()}

    outcomes = asyncio.run(scenario())
    assert outcomes == dict.fromkeys(("p", "q"), "error: batch returned 1 results for 2 requests")


@pytest.mark.parametrize(
    ("max_batch_size", "expected"),
    [(2, [["r0"], ["r1", "r2"], ["r3", "r4"], ["r5"]]), (8, [["r0"], ["r1", "r2", "r3", "r4", "r5"]])],
)
def test_a_backlog_is_split_at_max_batch_size(max_batch_size, expected):
    async def scenario() -> tuple[list[list[str]], list[str]]:
        run = ScriptedBatches()
        batcher = BacklogBatcher(run, max_batch_size=max_batch_size)
        tasks = [asyncio.create_task(batcher.submit("r0"))]
        await run.started(0)
        tasks += [asyncio.create_task(batcher.submit(f"r{i}")) for i in range(1, 6)]
        await _queued(batcher, 5)
        for batch in range(len(expected)):
            run.finish(batch)
        return run.batches, list(await asyncio.wait_for(asyncio.gather(*tasks), timeout=10))

    batches, results = asyncio.run(scenario())
    assert batches == expected
    assert results == [f"result of r{i}" for i in range(6)]


def test_with_concurrency_two_a_batch_starts_while_another_runs_and_a_third_waits():
    async def scenario() -> tuple[list[list[str]], list[str]]:
        run = ScriptedBatches()
        batcher = BacklogBatcher(run, max_batch_size=8, concurrency=2)
        tasks = [asyncio.create_task(batcher.submit("first"))]
        await run.started(0)
        tasks.append(asyncio.create_task(batcher.submit("second")))
        await run.started(1)  # did not wait for batch 0: a second batch runs beside it
        tasks += [asyncio.create_task(batcher.submit(name)) for name in ("third", "fourth")]
        await _queued(batcher, 2)  # both slots busy: these wait, together
        assert len(run.batches) == 2
        run.finish(1)  # the second batch ends first; its slot takes the backlog
        await run.started(2)
        run.finish(0)
        run.finish(2)
        return run.batches, list(await asyncio.wait_for(asyncio.gather(*tasks), timeout=10))

    batches, results = asyncio.run(scenario())
    assert batches == [["first"], ["second"], ["third", "fourth"]]
    assert results == ["result of first", "result of second", "result of third", "result of fourth"]


def test_with_concurrency_one_batches_never_overlap():
    async def scenario() -> list[list[str]]:
        run = ScriptedBatches()
        batcher = BacklogBatcher(run, max_batch_size=8, concurrency=1)
        tasks = [asyncio.create_task(batcher.submit("first"))]
        await run.started(0)
        tasks.append(asyncio.create_task(batcher.submit("second")))
        await _queued(batcher, 1)
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(run.batches) == 1  # the second request waits for the running batch
        run.finish(0)
        run.finish(1)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        return run.batches

    assert asyncio.run(scenario()) == [["first"], ["second"]]


def test_batch_concurrency_defaults_follow_the_encoder(tmp_path):
    from retrieval_server.config import ServerConfig

    config = ServerConfig(index_dir=tmp_path, num_cpus_per_replica=2)
    assert config.batch_concurrency_for("onnx") == 2  # a batch per core of a CPU encoder
    assert config.batch_concurrency_for("onnx-int8") == 2
    assert config.batch_concurrency_for("torch") == 1  # one device: its own threads parallelise a batch
    assert config.batch_concurrency_for(None) == 1  # bm25: no encoder
    assert ServerConfig(index_dir=tmp_path, num_cpus_per_replica=2, encode_threads=3).batch_concurrency_for("onnx") == 3
    assert ServerConfig(index_dir=tmp_path, batch_concurrency=4).batch_concurrency_for("torch") == 4
    with pytest.raises(ValueError):
        BacklogBatcher(lambda items: items, max_batch_size=8, concurrency=0)


def test_idle_slots_share_a_backlog_instead_of_one_taking_it_all():
    async def scenario() -> list[list[str]]:
        run = ScriptedBatches()
        batcher = BacklogBatcher(run, max_batch_size=8, concurrency=2)
        tasks = [asyncio.create_task(batcher.submit(f"r{i}")) for i in range(5)]
        await run.started(0)
        await run.started(1)
        for batch in (0, 1):
            run.finish(batch)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        return run.batches

    assert asyncio.run(scenario()) == [["r0", "r1", "r2"], ["r3", "r4"]]


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_request_right_after_a_batch_ends_is_served(concurrency):
    """The finished worker's done-callback runs after the caller resumes: a submit then must still start a batch."""

    async def scenario() -> list[str]:
        run = ScriptedBatches(hold=False)
        batcher = BacklogBatcher(run, max_batch_size=8, concurrency=concurrency)
        first = await batcher.submit("a")
        second = await batcher.submit("b")  # awaited in this task: no new task gives the callback time to run
        return [first, second]

    assert asyncio.run(asyncio.wait_for(scenario(), timeout=5)) == ["result of a", "result of b"]


def test_weighted_items_fill_a_batch_by_their_size_and_the_last_may_carry_it_past():
    """The NLI judge's calls weigh their pairs: a batch takes calls while it holds fewer than max_batch_size."""

    async def scenario() -> list[list[str]]:
        run = ScriptedBatches()
        batcher = BacklogBatcher(run, max_batch_size=8, size_of=len)
        tasks = [asyncio.create_task(batcher.submit(item)) for item in ("aaaaa", "bbbbb", "cc", "d")]
        await run.started(0)
        run.finish(0)
        await run.started(1)
        run.finish(1)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        return run.batches

    # 5 < 8 takes "bbbbb" too (10 pairs: the last call carries the batch past, unsplit); the rest is the next batch.
    assert asyncio.run(scenario()) == [["aaaaa", "bbbbb"], ["cc", "d"]]


def test_a_wait_for_company_ends_when_a_batch_is_full():
    async def scenario() -> list[list[str]]:
        run = ScriptedBatches(hold=False)
        batcher = BacklogBatcher(run, max_batch_size=4, max_wait_s=30.0)
        await asyncio.wait_for(asyncio.gather(*(batcher.submit(f"r{i}") for i in range(4))), timeout=10)
        return run.batches

    assert asyncio.run(scenario()) == [["r0", "r1", "r2", "r3"]]  # a 30 s wait would have hit the 10 s timeout


def test_a_batcher_kept_across_event_loops_works_in_each():
    run = ScriptedBatches(hold=False)
    batcher = BacklogBatcher(run, max_batch_size=8, max_wait_s=0.01)
    for word in ("first", "second"):  # as a judge client cached across asyncio.run calls
        assert asyncio.run(asyncio.wait_for(batcher.submit(word), timeout=5)) == f"result of {word}"


def test_close_cancels_the_callers_still_waiting():
    async def scenario() -> list[bool]:
        run = ScriptedBatches()
        batcher = BacklogBatcher(run, max_batch_size=1)
        tasks = [asyncio.create_task(batcher.submit(f"r{i}")) for i in range(2)]
        await run.started(0)  # r0 runs (held), r1 waits in the queue
        batcher.close()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
        return [isinstance(r, asyncio.CancelledError) for r in results]

    assert asyncio.run(scenario()) == [True, True]


def test_the_deployment_writes_no_access_log_line_per_request_unless_asked(tmp_path):
    from retrieval_server.config import ServerConfig
    from retrieval_server.launch import build_application

    def access_log(**options) -> bool:
        app = build_application(ServerConfig(index_dir=tmp_path, **options))
        return app._bound_deployment._deployment_config.logging_config["enable_access_log"]

    assert access_log() is False  # hundreds of lines a second cost the encoder's CPU
    assert access_log(access_log=True) is True


def test_a_strict_batch_never_holds_more_than_its_size():
    """The server's batches: bounded by queries, the piece that would overflow waits for the next batch."""

    async def scenario() -> list[list[str]]:
        run = ScriptedBatches(hold=False)
        batcher = BacklogBatcher(run, max_batch_size=8, size_of=len, strict=True)
        await asyncio.wait_for(asyncio.gather(*(batcher.submit(i) for i in ("aaaaa", "bbbbb", "cc", "d"))), 10)
        return run.batches

    assert asyncio.run(scenario()) == [["aaaaa"], ["bbbbb", "cc", "d"]]


def test_max_items_caps_a_batch_of_small_items():
    async def scenario() -> list[list[str]]:
        run = ScriptedBatches(hold=False)
        batcher = BacklogBatcher(run, max_batch_size=100, max_items=2)
        await asyncio.wait_for(asyncio.gather(*(batcher.submit(f"r{i}") for i in range(5))), 10)
        return run.batches

    assert asyncio.run(scenario()) == [["r0", "r1"], ["r2", "r3"], ["r4"]]


def test_a_small_request_overtakes_the_queued_pieces_of_large_ones():
    """Pieces of one group take turns with the others by work done: a newcomer goes next, not last."""

    async def scenario() -> list[list[str]]:
        run = ScriptedBatches()
        batcher = BacklogBatcher(run, max_batch_size=2, size_of=lambda item: 2, strict=True)
        tasks = [asyncio.create_task(batcher.submit(f"big{g}-{i}", group=f"big{g}")) for g in (1, 2) for i in range(3)]
        await run.started(0)
        tasks.append(asyncio.create_task(batcher.submit("small")))  # arrives while big1's first piece runs
        await _queued(batcher, 6)
        for batch in range(7):
            run.finish(batch)
            if batch < 6:
                await run.started(batch + 1)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        return run.batches

    batches = asyncio.run(scenario())
    # big2 has had nothing yet, so it goes first; then the newcomer, before any second piece of either.
    assert [b[0] for b in batches] == ["big1-0", "big2-0", "small", "big1-1", "big2-1", "big1-2", "big2-2"]
