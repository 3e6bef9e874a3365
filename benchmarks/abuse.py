"""The retrieval server under abuse (issues 33 and 54): bounded scenarios against a real server on 127.0.0.1.

Starts ``retrieval-server serve`` (the bundled corpus's MiniLM index, HAProxy front, defaults) and runs, one after
another, each for a bounded time and beside one honest client (one query, topk 3, one request at a time):

  flood         16 clients sending 512 queries x topk 100 per request (distinct queries: no cache help)
  slow clients  1,200 connections from 127.0.0.2 that send half a request line and then nothing (a slow-loris),
                more than the per-source bound (1,024); the honest client connects from 127.0.0.1
  slow readers  64 connections from 127.0.0.3, each a valid 512-query x topk-100 request (~25 MB answer; one query
                repeated) whose client reads 12 bytes and stops (SO_RCVBUF 4096); closed at the scenario's end
  slow bodies   200 connections from 127.0.0.4: full headers, Content-Length 64, 10 bytes, then nothing
  big bodies    rounds of 24 bodies of 60 MB at once: 12 declaring it in Content-Length, 12 chunked (no length)
  side door     every listening socket of the server's processes; any beyond loopback is printed
  crash loop    (a second server, on a copy of the index) its docstore truncated while it serves: the replica
                dies, its replacements cannot start; requests keep coming

Per scenario it prints the honest request's p50/p99, the replica's RSS before, at its peak during and 5 s after
the scenario, the status codes seen (honest client and abusers apart) and the slowest refusal; for the crash loop,
every answer's code, its Retry-After and detail, and how long the slowest refusal took. Targets (issues 33, 54):
honest p99 <= 1 s during the flood, RSS <= 2x idle and back near idle after, slow clients never starve real ones,
every refusal a 4xx/503 in <= 1 s (a stalled body: 408 at the front's 10 s), nothing but the front beyond
loopback, and a crash-looping server answers fast and `serve` exits non-zero.

    python benchmarks/abuse.py [--seconds 15] [--skip-crash-loop | --crash-loop-only]

Loopback only; every loop is bounded by --seconds; everything it started is stopped, everything it wrote deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
from scale import wait_healthy  # benchmarks/scale.py: /health of a server subprocess, or why not

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SMALL = {"queries": ["Who discovered penicillin?"], "topk": 3}
FLOOD_CLIENTS, FLOOD_QUERIES, FLOOD_TOPK = 16, 512, 100
SLOW_CONNECTIONS, SLOW_SOURCE = 1200, "127.0.0.2"
SLOW_READERS, SLOW_READER_SOURCE = 64, "127.0.0.3"
SLOW_BODIES, SLOW_BODY_SOURCE = 200, "127.0.0.4"
BIG_BODIES, BIG_BODY_BYTES = 24, 60 * 2**20
CRASH_LOOP_LIMIT_S = 240  # the crash loop runs until `serve` gives up, or this long


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``retrieval-server serve`` in a subprocess, its output kept in a file."""

    def __init__(self, workdir: Path, name: str, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"{name}.log"
        command = [sys.executable, "-m", "retrieval_server.cli", "serve", "--port", str(self.port), *args]
        with self.log.open("w") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 300.0) -> dict:
        """/health answers and `serve` said so (its replica watch starts only then)."""
        try:
            health = wait_healthy(self.url, self.process, timeout_s)
        except RuntimeError as err:
            raise RuntimeError(f"{err}; its output ends: {self.log.read_text()[-1500:]}") from err
        deadline = time.monotonic() + timeout_s
        while "retrieval server ready at" not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`serve` never said it was ready: {self.log.read_text()[-2000:]}")
            time.sleep(0.25)
        return health

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(2)  # SIGINT: `serve` shuts Ray down itself
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(timeout=30)


def post_status(http: httpx.Client, url: str, body: dict) -> str:
    """The status code of one POST, or what stopped it (a timeout, a connection error)."""
    try:
        return str(http.post(url, json=body).status_code)
    except httpx.TimeoutException:
        return "timeout"
    except httpx.TransportError as err:
        return type(err).__name__


class RssPeak:
    """The highest RSS of a process, sampled every 50 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.process, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.NoSuchProcess:
                return
            time.sleep(0.05)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


class SmallClient:
    """One query at a time, for as long as the scenario runs: latencies and status codes."""

    def __init__(self, url: str) -> None:
        self.url, self.latencies, self.codes = url, [], collections.Counter()
        self.slowest_refusal, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self._stop.is_set():
                started = time.perf_counter()
                code = post_status(http, f"{self.url}/retrieve", SMALL)
                elapsed = time.perf_counter() - started
                self.codes[code] += 1
                if code == "200":
                    self.latencies.append(elapsed)  # the p50/p99 of answers; refusals are counted apart
                else:
                    self.slowest_refusal = max(self.slowest_refusal, elapsed)
                time.sleep(0.05)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=60)
        lat = np.asarray(self.latencies or [float("nan")])
        return {
            "small_p50_s": float(np.percentile(lat, 50)),
            "small_p99_s": float(np.percentile(lat, 99)),
            "small_requests": len(self.latencies),
            "small_codes": dict(self.codes),
            "small_slowest_refusal_s": self.slowest_refusal,
        }


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def scenario(name: str, server_url: str, replica_pid: int, idle_mb: float, abuse, seconds: float) -> dict:
    before = rss_mb(replica_pid)
    rss = RssPeak(replica_pid)
    small = SmallClient(server_url)
    try:
        abusers = abuse(seconds)
    finally:
        row = small.stop()
        peak = rss.stop()
    time.sleep(5)  # what the replica gives back once the abusers have gone
    row.update(
        name=name, before_rss_mb=before, peak_rss_mb=peak, after_rss_mb=rss_mb(replica_pid), idle_rss_mb=idle_mb,
        rss_ratio=peak / idle_mb, **abusers,
    )  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


# ---------------------------------------------------------------- the abusers
def flood(url: str, seconds: float) -> dict:
    import aiohttp

    codes, slowest_refusal = collections.Counter(), 0.0

    async def client(n: int, http) -> None:
        nonlocal slowest_refusal
        deadline, i = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            queries = [f"flood {n}.{i}.{j}: rivers, deserts and empires of Africa" for j in range(FLOOD_QUERIES)]
            started = time.perf_counter()
            try:
                async with http.post("retrieve", json={"queries": queries, "topk": FLOOD_TOPK}) as response:
                    await response.read()
                    code = str(response.status)
            except asyncio.TimeoutError:
                code = "timeout"
            except aiohttp.ClientError as err:
                code = type(err).__name__
            codes[code] += 1
            if code != "200":
                slowest_refusal = max(slowest_refusal, time.perf_counter() - started)
                await asyncio.sleep(0.2)  # what a client honouring Retry-After (1 s) would roughly do, shortened
            i += 1

    async def run() -> None:
        timeout = aiohttp.ClientTimeout(total=seconds + 60)
        async with aiohttp.ClientSession(base_url=url + "/", timeout=timeout) as http:
            await asyncio.gather(*(client(n, http) for n in range(FLOOD_CLIENTS)))

    asyncio.run(run())
    return {"abuser_codes": dict(codes), "abuser_slowest_refusal_s": slowest_refusal}


def slow_clients(url: str, seconds: float) -> dict:
    port = int(url.rsplit(":", 1)[1])
    sockets, refused, outcomes = [], 0, collections.Counter()
    for _ in range(SLOW_CONNECTIONS):
        sock = socket.socket()
        sock.bind((SLOW_SOURCE, 0))
        sock.settimeout(5)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")  # ... and never the rest
            sockets.append((sock, time.monotonic()))
        except OSError:
            refused += 1
            sock.close()
    deadline = time.monotonic() + seconds
    cut_after = []
    for sock, opened in sockets:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            answer = sock.recv(64)
            outcomes[answer.split(b"\r\n")[0].decode(errors="replace") or "closed"] += 1
            cut_after.append(time.monotonic() - opened)
        except TimeoutError:
            outcomes["still open at the end"] += 1
        except OSError as err:
            outcomes[type(err).__name__] += 1
        finally:
            sock.close()
    return {
        "slow_connections": SLOW_CONNECTIONS,
        "abuser_codes": dict(outcomes),
        "slow_refused_at_connect": refused,
        "slow_cut_after_s_max": max(cut_after, default=0.0),
    }


def slow_readers(url: str, seconds: float) -> dict:
    """Valid large requests whose clients read the first 12 bytes of the answer and then nothing until the end."""
    port = int(url.rsplit(":", 1)[1])
    # One query 512 times: the answer's size is what matters here, not the encoder's time (encoded once, then cached)
    queries = ["slow reader: rivers, deserts and empires of Africa"] * FLOOD_QUERIES
    body = json.dumps({"queries": queries, "topk": FLOOD_TOPK}).encode()
    head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    sockets, outcomes = [], collections.Counter()
    deadline = time.monotonic() + seconds
    for _ in range(SLOW_READERS):
        if time.monotonic() > deadline:
            break
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.bind((SLOW_READER_SOURCE, 0))
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(head % len(body) + body)
            outcomes[sock.recv(12).decode(errors="replace").strip() or "closed"] += 1
        except OSError as err:
            outcomes[type(err).__name__] += 1
        sockets.append(sock)
    time.sleep(max(0.0, deadline - time.monotonic()))  # they hold their answers until the scenario ends
    for sock in sockets:
        sock.close()
    return {"slow_readers": len(sockets), "abuser_codes": dict(outcomes)}


def slow_bodies(url: str, seconds: float) -> dict:
    """Full headers and 10 of the 64 bytes their Content-Length promises, then nothing: how long until the server
    answers (408 at the front's http-request timeout, 10 s) and with what."""
    import select

    port = int(url.rsplit(":", 1)[1])
    sockets, outcomes, answered_after = [], collections.Counter(), []
    for _ in range(SLOW_BODIES):
        sock = socket.socket()
        sock.bind((SLOW_BODY_SOURCE, 0))
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 64\r\n\r\n{"queries"')
            sockets.append((sock, time.monotonic()))
        except OSError as err:
            outcomes[type(err).__name__] += 1
            sock.close()
    deadline = time.monotonic() + max(seconds, 15.0)  # long enough to see the 10 s timeout
    waiting = dict(sockets)
    while waiting and time.monotonic() < deadline:
        ready, _, _ = select.select(list(waiting), [], [], 0.5)
        for sock in ready:
            try:
                status = sock.recv(64).split(b"\r\n")[0].decode(errors="replace")
            except OSError as err:
                status = type(err).__name__
            outcomes[status.split(" ", 2)[1] if status.startswith("HTTP/") else status or "closed"] += 1
            answered_after.append(time.monotonic() - waiting.pop(sock))
            sock.close()
    outcomes["still open at the end"] += len(waiting)
    for sock in waiting:
        sock.close()
    return {
        "slow_bodies": len(sockets),
        "abuser_codes": dict(outcomes),
        "slow_body_answered_after_s_min": min(answered_after, default=0.0),
        "slow_body_answered_after_s_max": max(answered_after, default=0.0),
    }


def side_doors(server_pid: int) -> dict:
    """Every listening TCP socket of the server's processes; those not on loopback are its side doors."""
    listening = collections.defaultdict(set)
    root = psutil.Process(server_pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = proc.name()
            for conn in proc.net_connections("tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    listening[name].add(f"{conn.laddr.ip}:{conn.laddr.port}")
        except psutil.Error:
            continue
    loopback = ("127.", "::1:", "::ffff:127.")  # the last: IPv4 loopback on a dual-stack socket
    beyond = {name: sorted(a for a in addrs if not a.startswith(loopback)) for name, addrs in listening.items()}
    return {
        "name": "side door",
        "listening": {name: sorted(addrs) for name, addrs in listening.items()},
        "beyond_loopback": {name: addrs for name, addrs in beyond.items() if addrs},
    }


def big_bodies(url: str, seconds: float) -> dict:
    """Rounds of BIG_BODIES bodies at once; each sends until the server answers, timed to its first answer byte."""
    import select

    port = int(url.rsplit(":", 1)[1])
    codes, refusal_times = collections.Counter(), collections.defaultdict(list)
    chunk = b'{"queries": ["' + b"x" * (2**20 - 14)

    def send(declared: bool) -> None:
        kind = "declared" if declared else "chunked"
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=seconds + 30) as sock:
            length = f"Content-Length: {BIG_BODY_BYTES}" if declared else "Transfer-Encoding: chunked"
            head = f"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{length}\r\n\r\n"
            try:
                sock.sendall(head.encode())
                for _ in range(BIG_BODY_BYTES // len(chunk)):
                    if select.select([sock], [], [], 0)[0]:  # the server answered (or closed): stop sending
                        break
                    sock.sendall(chunk if declared else b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                pass  # the server stopped reading: its answer says why
            try:
                status = sock.recv(64).split(b"\r\n")[0].decode(errors="replace")
            except OSError as err:
                status = type(err).__name__
            answered = time.perf_counter() - started
        codes[f"{kind} " + (status.split(" ", 2)[1] if status.startswith("HTTP/") else status or "closed")] += 1
        refusal_times[kind].append(answered)

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # rounds of BIG_BODIES at once, for the scenario's length
        threads = [threading.Thread(target=send, args=(i % 2 == 0,)) for i in range(BIG_BODIES)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=seconds + 60)
    return {
        "abuser_codes": dict(codes),
        "abuser_slowest_refusal_s": max((t for times in refusal_times.values() for t in times), default=0.0),
        **{f"refusal_p99_s_{kind}": float(np.percentile(times, 99)) for kind, times in refusal_times.items()},
    }


def crash_loop(index_dir: Path, workdir: Path, seconds: float, ingress: str = "auto") -> dict:
    """A server on a copy of the index whose docstore is truncated while it serves."""
    copy = workdir / "index-copy"
    shutil.copytree(index_dir, copy, symlinks=False)
    server = Server(
        workdir, "crash-loop", "--index-dir", str(copy), "--max-replica-restarts", "3", "--ingress", ingress
    )
    try:
        health = server.wait_ready()
        store = copy / "docstore.arrow"
        with store.open("r+b") as handle:
            handle.truncate(store.stat().st_size // 3)
        codes, exited_after = collections.Counter(), None
        refusal_times, after_give_up, details, slowest = [], [], collections.Counter(), {}
        started = time.monotonic()
        with httpx.Client(timeout=60) as http:
            while time.monotonic() - started < CRASH_LOOP_LIMIT_S and exited_after is None:
                t0 = time.perf_counter()
                said = ""
                try:
                    answer = http.post(f"{server.url}/retrieve", json={"queries": [f"crash {t0} Nile"], "topk": 3})
                    code = str(answer.status_code)
                    said = f"{code} (Retry-After {answer.headers.get('retry-after')}): {answer.text[:90]}"
                except httpx.TimeoutException:
                    code = "timeout"
                except httpx.TransportError as err:
                    code = type(err).__name__  # a cut connection, a refused one
                took = time.perf_counter() - t0
                if "error: the replicas" in server.log.read_text():
                    codes[f"{code} after serve gave up"] += 1  # it is stopping the server: refused connections
                    after_give_up.append(took)  # or a request held until then
                else:
                    codes[code] += 1
                    if code != "200":
                        refusal_times.append(took)
                        details[said or code] += 1
                        slowest[said or code] = max(slowest.get(said or code, 0.0), took)
                if server.process.poll() is not None:
                    exited_after = time.monotonic() - started
                time.sleep(0.2)
        return {
            "name": f"crash loop ({ingress})",
            "replica_pid_before": health["replica_pid"],
            "codes": dict(codes),
            "slowest_refusal_s": max(refusal_times, default=0.0),
            "refusal_p50_s": float(np.percentile(refusal_times, 50)) if refusal_times else 0.0,
            "refusals_over_1s": sum(t > 1.0 for t in refusal_times),
            "slowest_after_serve_gave_up_s": max(after_give_up, default=0.0),
            "answers": dict(details),
            "slowest_by_answer_s": slowest,
            "serve_exit_code": server.process.poll(),
            "serve_exited_after_s": exited_after,
            "serve_said": [
                line for line in server.log.read_text().splitlines() if "stopped (" in line or "error:" in line
            ][-6:],
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each scenario")
    parser.add_argument("--skip-crash-loop", action="store_true")
    parser.add_argument("--crash-loop-only", action="store_true", help="run the crash loop alone")
    parser.add_argument("--crash-loop-ingress", default="auto", help="auto | haproxy | proxy: the crash loop's front")
    args = parser.parse_args()

    from retrieval_server.launch import ensure_index
    from verl_evidence.bundled import corpus_path

    index_dir = ensure_index(corpus_path(), show_progress=False)
    workdir = Path(tempfile.mkdtemp(prefix="abuse-bench-"))
    rows = []
    if not args.crash_loop_only:
        rows = serving_scenarios(index_dir, workdir, args.seconds)
    crash = None
    try:
        if not args.skip_crash_loop:
            crash = crash_loop(index_dir, workdir, args.seconds, args.crash_loop_ingress)
            print(json.dumps(crash), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    if rows:
        print_scenarios(rows, args.seconds)
    if crash is not None:
        print(
            f"crash loop: codes {crash['codes']}; slowest refusal {crash['slowest_refusal_s']:.2f} s (<= 1 s), "
            f"median {crash['refusal_p50_s']:.3f} s, {crash['refusals_over_1s']} over 1 s (slowest once serve gave "
            f"up: {crash['slowest_after_serve_gave_up_s']:.2f} s); serve exit code "
            f"{crash['serve_exit_code']} after {crash['serve_exited_after_s']} s"
        )
        for answer, count in crash["answers"].items():
            print(f"  {count} x {answer} (slowest {crash['slowest_by_answer_s'][answer]:.2f} s)")


def serving_scenarios(index_dir: Path, workdir: Path, seconds: float) -> list[dict]:
    """The quiet, flood, slow-client and big-body scenarios against one server."""
    rows = []
    server = Server(workdir, "server", "--index-dir", str(index_dir))
    try:
        health = server.wait_ready()
        pid = health["replica_pid"]
        for _ in range(20):  # warm-up
            httpx.post(f"{server.url}/retrieve", json=SMALL, timeout=30)
        idle_mb = psutil.Process(pid).memory_info().rss / 2**20
        baseline = scenario("quiet", server.url, pid, idle_mb, lambda s: (time.sleep(s / 3), {})[1], seconds)
        rows.append(baseline)
        rows.append(scenario("flood", server.url, pid, idle_mb, lambda s: flood(server.url, s), seconds))
        rows.append(scenario("slow clients", server.url, pid, idle_mb, lambda s: slow_clients(server.url, s), seconds))
        rows.append(scenario("slow readers", server.url, pid, idle_mb, lambda s: slow_readers(server.url, s), seconds))
        rows.append(scenario("slow bodies", server.url, pid, idle_mb, lambda s: slow_bodies(server.url, s), seconds))
        rows.append(scenario("big bodies", server.url, pid, idle_mb, lambda s: big_bodies(server.url, s), seconds))
        doors = side_doors(server.process.pid)
        print(json.dumps(doors), flush=True)
        rows.append(doors)
    finally:
        server.stop()
    return rows


def print_scenarios(rows: list[dict], seconds: float) -> None:
    doors = next((r for r in rows if r["name"] == "side door"), None)
    rows = [r for r in rows if r["name"] != "side door"]
    print(f"\nabuse scenarios, {seconds:g} s each, beside one honest client (1 query, topk 3, sequential)")
    print(
        "scenario     | honest p50 s | honest p99 s | honest codes         | replica RSS MB before / peak / after "
        "(peak x idle) | abusers' codes"
    )
    print("(p50/p99 of the honest client's answered requests; its refusals are in its codes; after: 5 s later)")
    for row in rows:
        print(
            f"{row['name']:<12} | {row['small_p50_s']:12.3f} | {row['small_p99_s']:12.3f} | "
            f"{json.dumps(row['small_codes']):<20} | {row['before_rss_mb']:6.0f} / {row['peak_rss_mb']:6.0f} / "
            f"{row['after_rss_mb']:6.0f} ({row['rss_ratio']:.2f}x){'':10} | {json.dumps(row.get('abuser_codes', {}))}"
        )
    by_name = {r["name"]: r for r in rows}
    refusals = [r.get("abuser_slowest_refusal_s", 0.0) for r in rows]
    failed_beside_slow = sum(v for k, v in by_name["slow clients"]["small_codes"].items() if k != "200")
    bodies = by_name["slow bodies"]
    print(
        f"targets: honest p99 during the flood {by_name['flood']['small_p99_s']:.2f} s (<= 1 s); peak RSS "
        f"{max(r['rss_ratio'] for r in rows):.2f}x idle (<= 2x); honest requests failed during slow clients: "
        f"{failed_beside_slow} (0); slowest refusal {max(refusals):.2f} s (<= 1 s); stalled bodies answered after "
        f"{bodies['slow_body_answered_after_s_min']:.1f}-{bodies['slow_body_answered_after_s_max']:.1f} s (10 s)"
    )
    if doors is not None:
        print(f"side door: listening beyond loopback: {json.dumps(doors['beyond_loopback']) or 'none'}")


if __name__ == "__main__":
    main()
