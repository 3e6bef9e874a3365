"""Micro-batching of concurrent asyncio calls: the server's requests and the NLI judge's pairs go through this one.

Standard library only, so that the reward side (``verl_evidence``) can use it without the server's dependencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class BacklogBatcher(Generic[Item, Result]):
    """Batches of whatever queued while earlier batches ran, up to ``concurrency`` batches at once.

    Hand-written because no library batches this way: an idle batcher runs a lone
    call at once (no timer to wait out); under load every call that arrived during
    a batch joins the next one, up to ``max_batch_size``. Ray Serve 2.60's
    ``@serve.batch`` cannot do this: it closes a batch on its timer *before* waiting
    for the running batch (ray/serve/batching.py, ``_process_batches``), so a backlog
    is cut into timer-sized slivers.

    ``max_wait_s`` > 0 adds a wait for company before each batch, ended early by a
    full batch (fewer, larger batches at the cost of latency). ``concurrency`` > 1
    lets a new batch start while others run (one per CPU thread of a CPU encoder):
    no core idles while one batch finishes its slowest part, and a batch never waits
    for another to end. ``size_of`` weighs an item (default 1): the NLI judge counts
    a call by its pairs. A batch takes items while it holds less than
    ``max_batch_size``, so its last item may carry it past (an item is never split);
    ``strict=True`` leaves that item for the next batch instead (unless it would be
    alone), so a batch never holds more than ``max_batch_size``. ``max_items`` caps
    the items of a batch whatever their sizes.

    Items submitted under one ``group`` (the pieces of one large request) share the
    queue fairly with everyone else: each batch takes next from the group that has had
    the least work taken so far, first come first served among equals. An item without
    a group is a group of its own, so without groups the queue is first in, first out,
    and a small request never waits behind all the pieces of a large one.

    ``run_batch`` returns one result per item, in order; if it raises, every caller
    of that batch gets the error. A caller that left (its await cancelled) is
    skipped. Each event loop that calls :meth:`submit` gets its own workers: a
    batcher kept across ``asyncio.run`` calls (tests, a restarted worker) works in each.
    """

    def __init__(
        self,
        run_batch: Callable[[list[Item]], Awaitable[list[Result]]],
        max_batch_size: int,
        max_wait_s: float = 0.0,
        concurrency: int = 1,
        size_of: Callable[[Item], int] | None = None,
        strict: bool = False,
        max_items: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_items is not None and max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        self._run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.concurrency = concurrency
        self.strict = strict
        self.max_items = max_items
        self._size_of = size_of or (lambda item: 1)
        self._queue = _FairQueue()
        self._queued_size = 0  # sum of the queued items' sizes
        self._workers: set[asyncio.Task[None]] = set()
        self._running = 0  # batches running now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._full: asyncio.Event | None = None  # set when the queue holds a full batch: ends a wait for company

    @property
    def queued(self) -> int:
        """Calls waiting for a batch."""
        return len(self._queue)

    @property
    def queued_size(self) -> int:
        """The summed sizes of the calls waiting for a batch (callers that left count until a batch skips them)."""
        return self._queued_size

    async def submit(self, item: Item, group: object = None) -> Result:
        return await self.enqueue(item, group)

    def enqueue(self, item: Item, group: object = None) -> asyncio.Future[Result]:
        """Queue ``item`` now (no await between a caller's look at :attr:`queued_size` and its place in the queue);
        the future of its result. Cancelling the future takes the item out of any batch not yet run."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind(loop)
        future: asyncio.Future[Result] = loop.create_future()
        size = self._size_of(item)
        self._queue.append((item, size, future), group)
        self._queued_size += size
        if self._queued_size >= self.max_batch_size:
            self._full.set()
        self._spawn()
        return future

    def close(self) -> None:
        """Stop the workers; callers still waiting get CancelledError."""
        for worker in self._workers:
            worker.cancel()
        self._workers = set()
        for _, _, future in self._queue.drain():
            future.cancel()
        self._queued_size = 0

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        # A new event loop: the old one's workers are gone with it, and its callers cannot be answered from here.
        self._loop, self._full, self._workers, self._running = loop, asyncio.Event(), set(), 0
        self._queue.keep(lambda entry: entry[2].get_loop() is loop)
        self._queued_size = sum(size for _, size, _ in self._queue.entries())

    def _spawn(self) -> None:
        # Not a done-callback: it runs only after the woken caller, whose next submit would find no free slot.
        self._workers = {worker for worker in self._workers if not worker.done()}
        if len(self._workers) < self.concurrency:
            self._workers.add(asyncio.create_task(self._drain()))

    def _take(self) -> list[tuple[Item, asyncio.Future[Result]]]:
        # A fair share of the backlog per free slot: two idle slots split it rather than one taking it all.
        share = -(-self._queued_size // max(1, self.concurrency - self._running))
        limit = min(self.max_batch_size, share)
        taken, size = [], 0
        max_items = self.max_items or len(self._queue)
        while self._queue and size < limit and len(taken) < max_items:
            if self.strict and taken and size + self._queue.peek()[1] > self.max_batch_size:
                break
            item, item_size, future = self._queue.popleft()
            self._queued_size -= item_size
            size += item_size
            taken.append((item, future))
        if self._queued_size < self.max_batch_size:
            self._full.clear()
        return taken

    async def _wait_for_company(self) -> None:
        if self.max_wait_s > 0 and self._queued_size < self.max_batch_size:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._full.wait(), self.max_wait_s)

    async def _drain(self) -> None:
        while self._queue:
            await self._wait_for_company()
            taken = self._take()
            if self._queue:
                self._spawn()  # the rest goes to another slot, if one is free
            live = [(item, future) for item, future in taken if not future.done()]  # skip callers who left
            if not live:
                continue
            self._running += 1
            try:
                results = await self._run_batch([item for item, _ in live])
                if len(results) != len(live):  # zip would leave the unmatched callers waiting forever
                    raise RuntimeError(f"batch returned {len(results)} results for {len(live)} requests")
            except asyncio.CancelledError:  # close(): the batch's callers are not left waiting
                for _, future in live:
                    future.cancel()
                raise
            except Exception as err:
                for _, future in live:
                    if not future.done():
                        future.set_exception(err)
                continue
            finally:
                self._running -= 1
            for (_, future), result in zip(live, results):
                if not future.done():
                    future.set_result(result)


class _FairQueue:
    """Entries in groups; the next entry comes from the group with the least size taken so far, then the oldest.

    Hand-written: a heap of groups keyed by (size taken, arrival) is all it is, and no queue library orders this way.
    """

    def __init__(self) -> None:
        self._groups: dict[object, tuple[deque, list[int]]] = {}  # group -> (its entries, [size taken, arrival])
        self._heap: list[tuple[int, int, object]] = []  # (size taken, arrival, group) of every group with entries
        self._arrivals = itertools.count()
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def append(self, entry: tuple, group: object = None) -> None:
        key = ("item", next(self._arrivals)) if group is None else ("group", group)
        if key not in self._groups:
            self._groups[key] = (deque(), [0, next(self._arrivals)])
            heapq.heappush(self._heap, (0, self._groups[key][1][1], key))
        self._groups[key][0].append(entry)
        self._length += 1

    def peek(self) -> tuple:
        return self._groups[self._heap[0][2]][0][0]

    def popleft(self) -> tuple:
        _, arrival, key = heapq.heappop(self._heap)
        entries, taken = self._groups[key]
        entry = entries.popleft()
        self._length -= 1
        taken[0] += entry[1]
        if entries:
            heapq.heappush(self._heap, (taken[0], arrival, key))
        else:
            del self._groups[key]
        return entry

    def entries(self) -> list[tuple]:
        return [entry for entries, _ in self._groups.values() for entry in entries]

    def drain(self) -> list[tuple]:
        entries = self.entries()
        self.keep(lambda entry: False)
        return entries

    def keep(self, wanted: Callable[[tuple], bool]) -> None:
        for key, (entries, _) in list(self._groups.items()):
            entries_kept = deque(entry for entry in entries if wanted(entry))
            self._length -= len(entries) - len(entries_kept)
            if entries_kept:
                self._groups[key] = (entries_kept, self._groups[key][1])
            else:
                del self._groups[key]
        self._heap = [(taken, arrival, key) for key, (_, (taken, arrival)) in self._groups.items()]
        heapq.heapify(self._heap)
