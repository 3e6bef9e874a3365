"""HAProxy as Ray Serve runs it for one of our servers: bound to the server's host, dying with its parent.

Ray Serve starts ``$RAY_SERVE_HAPROXY_BINARY_PATH -db -f <config> ...`` from its
HAProxyManager actor. ``start_server`` points that variable at a two-line script
(:func:`write_launcher`) that runs this module, which does two things and then
*becomes* HAProxy (``exec``: same pid and command line, so Ray's reloads and
signals reach HAProxy itself):

- every listener in the config is bound to the server's host. Ray's template puts
  the stats and metrics listeners on all interfaces whatever the host it was given;
- the kernel is asked to SIGKILL HAProxy when its parent dies. When the actor is
  killed hard (OOM killer, a whole server killed at once), nothing in Ray stops
  HAProxy, and the orphan keeps the server's port.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shlex
import signal
import sys
from pathlib import Path

WILDCARD_HOSTS = {"", "0.0.0.0", "::", "*"}

# "bind :9101", "bind *:8404": a listener on every interface.
_ANY_INTERFACE_BIND = re.compile(r"^(\s*bind\s+)\*?:(\d+)\b", re.MULTILINE)


def bind_to_host(config_text: str, host: str) -> str:
    """The HAProxy config with every all-interfaces ``bind`` on ``host`` instead (unchanged for a wildcard host)."""
    if host in WILDCARD_HOSTS:
        return config_text
    return _ANY_INTERFACE_BIND.sub(lambda m: f"{m.group(1)}{host}:{m.group(2)}", config_text)


def write_launcher(path: Path, host: str, haproxy: str) -> Path:
    """An executable script that Ray Serve can run as its HAProxy binary."""
    command = [sys.executable, "-m", "retrieval_server.haproxy_front", "--host", host, "--haproxy", haproxy]
    # $PPID: the actor that runs us; checked after asking for the death signal, which is lost if it is already gone.
    path.write_text(f'#!/bin/sh\nexec {shlex.join(command)} --parent "$PPID" -- "$@"\n')
    path.chmod(0o700)
    return path


def _rewrite_config(config_path: Path, host: str) -> None:
    # Ray writes the config under this lock; take it too so a concurrent rewrite is never half-read.
    with open(f"{config_path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = config_path.read_text()
        bound = bind_to_host(text, host)
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
    parser.add_argument("haproxy_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    haproxy_args = args.haproxy_args[1:] if args.haproxy_args[:1] == ["--"] else args.haproxy_args
    if "-f" in haproxy_args:
        _rewrite_config(Path(haproxy_args[haproxy_args.index("-f") + 1]), args.host)
    _die_with_parent(args.parent)
    os.execv(args.haproxy, [args.haproxy, *haproxy_args])


if __name__ == "__main__":
    main()
