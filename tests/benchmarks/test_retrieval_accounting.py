"""benchmarks/retrieval.py's per-level CPU accounting (ProcessCpu): a server's time on a CPU and waiting for one.

No speeds are asserted: only that the accounting sees a process's work where it happened (a thread that burned CPU
is counted, a process that slept is not) and that a process's threads are all summed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

pytestmark = pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/task").is_dir(), reason="needs Linux /proc")


retrieval_benchmark = load_benchmark("retrieval")


def _burn(cpu_seconds: float) -> None:
    # Until this thread has had the CPU for cpu_seconds, however long the machine makes that take.
    start = time.thread_time()
    while time.thread_time() - start < cpu_seconds:
        sum(range(1000))


def test_cpu_of_a_thread_that_ended_during_the_interval_is_counted() -> None:
    # A thread pool's idle workers exit mid-level: their CPU time must stay in the process's count.
    cpu = retrieval_benchmark.ProcessCpu(os.getpid())
    worker = threading.Thread(target=_burn, args=(0.3,))
    worker.start()
    worker.join()
    on_cpu, waiting = cpu.seconds()
    assert on_cpu >= 0.25, f"0.3 s of CPU burned on a thread, counted {on_cpu:.3f} s"
    assert waiting >= 0


def test_waiting_is_counted_per_thread_and_never_negative_when_threads_end() -> None:
    release = threading.Event()
    workers = [threading.Thread(target=lambda: (_burn(0.05), release.wait())) for _ in range(3)]
    for worker in workers:
        worker.start()
    cpu = retrieval_benchmark.ProcessCpu(os.getpid())  # counted while the three are alive
    release.set()
    for worker in workers:
        worker.join()
    _burn(0.05)
    assert cpu.seconds()[1] >= 0


def test_a_sleeping_process_is_not_counted_as_on_a_cpu() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(1.0)  # past the interpreter's start-up
        cpu = retrieval_benchmark.ProcessCpu(child.pid)
        time.sleep(0.5)
        on_cpu, _ = cpu.seconds()
    finally:
        child.kill()
        child.wait()
    assert on_cpu < 0.05
