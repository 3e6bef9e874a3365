"""The front deployment behind Serve's Python proxy (``--ingress proxy``): refuses at once while no replica runs.

Serve's Python proxy holds a request for a deployment without a running replica in its router until a replica is
back (a crash-looping one: until ``serve`` gives up), and it takes no middleware or fast-fail option. So on that
path the app's HTTP ingress is this small deployment, which never loads the index and stays up: it forwards each
request unchanged to the retrieval deployment through a handle, and answers 503 + Retry-After with Serve's recorded
cause while Serve reports no running retrieval replica, or when the replica dies under the request. HAProxy (the
default front) answers those itself (``haproxy_front``); there the retrieval deployment is the ingress, no hop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from retrieval_server.app import BodyTooLarge, problem, receive_body, too_large
from retrieval_server.config import ServerConfig
from retrieval_server.deployment import REPLICA_HEALTH_CHECK_PERIOD_S, RETRIEVAL_DEPLOYMENT, deployment_cause

logger = logging.getLogger(__name__)

# How often the front asks Serve for the retrieval replicas' states.
STATUS_POLL_S = 0.5
# Serve counts a dead replica as running until its next health check fails (every REPLICA_HEALTH_CHECK_PERIOD_S):
# after the only replica died under a request, the front refuses for this long unless Serve catches up sooner.
LOST_REPLICA_GRACE_S = REPLICA_HEALTH_CHECK_PERIOD_S + 2 * STATUS_POLL_S
# Beyond the replica's own bound (--request-timeout-s, its 503 comes first): reading the body, two handle hops.
FORWARD_MARGIN_S = 2.0
RETRY_LATER = {"Retry-After": "1"}


@dataclass
class ReplicaView:
    """The retrieval deployment as Serve last reported it (how many replicas run, and why not when none does), and
    a replica the front saw die that Serve still counts."""

    running: int | None = None  # None: not looked at yet (the front then forwards, as Serve's proxy would)
    cause: str = ""
    lost: str = ""  # the error of the only replica, dead under a request, while Serve has not yet noticed
    lost_until: float = 0.0

    def update(self, running: int, message: str, status: str) -> None:
        self.running, self.cause = running, deployment_cause(message, status)
        if running == 0:
            self.lost = ""  # Serve noticed: its own cause from here on

    def replica_died(self, error: str, now: float) -> None:
        """A request's replica died under it. Were it the only one, a request sent now would wait in Serve's router
        until Serve notices (up to a health-check period): refuse instead. With others running, they answer."""
        if self.running is not None and self.running <= 1:
            self.lost, self.lost_until = error, now + LOST_REPLICA_GRACE_S

    def refusal(self, now: float) -> str | None:
        """The 503's detail while no retrieval replica runs; None while requests can go through."""
        if self.running == 0:
            return f"no retrieval replica is running ({self.cause}); retry later"
        if self.lost and now < self.lost_until:
            return f"no retrieval replica is running (the last one stopped: {self.lost}); retry later"
        return None


# A plain HTTP deployment (Serve calls it with each request), not FastAPI: Serve allows one FastAPI ingress per app.
@serve.deployment(name="PythonProxyFront", ray_actor_options={"num_cpus": 0})
class PythonProxyFront:
    def __init__(self, retrieval: DeploymentHandle, config: dict[str, Any]) -> None:
        self.retrieval = retrieval
        self.config = ServerConfig.model_validate(config)
        self.app_name = serve.get_replica_context().app_name
        self.view = ReplicaView()
        self.refusing = asyncio.Event()  # set while the view says no replica runs: wakes the requests waiting
        self.poller: asyncio.Task | None = None

    async def _poll(self) -> None:
        while True:
            try:
                status = await asyncio.to_thread(serve.status)  # a controller call: off the event loop
                deployment = status.applications[self.app_name].deployments[RETRIEVAL_DEPLOYMENT]
                self.view.update(deployment.replica_states.get("RUNNING", 0), deployment.message, deployment.status)
            except Exception:  # a controller restarting, the app being deleted: look again next time
                logger.warning("could not read the retrieval deployment's status", exc_info=True)
            self._refusing_changed()
            await asyncio.sleep(STATUS_POLL_S)

    def _refusing_changed(self) -> None:
        if self.view.refusal(time.monotonic()) is None:
            self.refusing.clear()
        else:
            self.refusing.set()

    async def __call__(self, request: Request) -> Response:
        if self.poller is None:  # started here: the replica's event loop runs requests, not the constructor
            self.poller = asyncio.ensure_future(self._poll())
        if (refusal := self.view.refusal(time.monotonic())) is not None:
            return problem(503, refusal, headers=RETRY_LATER)
        try:
            body = await receive_body(request, self.config.max_body_bytes)
        except BodyTooLarge as err:
            return too_large(err)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.scope["headers"]]
        path = request.scope["path"].removeprefix(request.scope.get("root_path", "")) or "/"  # below the route prefix
        answer = self.retrieval.forwarded.remote(request.method, path, request.url.query, headers, body)
        reply, stopped = asyncio.ensure_future(answer), asyncio.ensure_future(self.refusing.wait())
        bound_s = self.config.request_timeout_s + FORWARD_MARGIN_S
        try:
            done, _ = await asyncio.wait({reply, stopped}, timeout=bound_s, return_when=asyncio.FIRST_COMPLETED)
            if reply not in done:  # held in Serve's router (no replica) or in a replica that does not answer
                late = f"the retrieval replica did not answer within {bound_s:g} s; retry later"
                detail = self.view.refusal(time.monotonic()) or late
                return problem(503, detail, headers=RETRY_LATER)
            status, answer_headers, answer_body = reply.result()
        except Exception as err:  # the replica died under the request (RayActorError, ActorUnavailableError, ...)
            said = str(err).strip().splitlines()
            cause = f"{type(err).__name__}: {said[0]}" if said else type(err).__name__
            if isinstance(err, RayActorError):  # not a cancelled or refused call: the replica's process is gone
                self.view.replica_died(cause, time.monotonic())
                self._refusing_changed()
            return problem(503, f"the retrieval replica stopped while answering this request ({cause}); retry later",
                           headers=RETRY_LATER)  # fmt: skip
        finally:
            if not reply.done():  # refused, timed out, or the client left (Serve cancels this call): drop the request
                answer.cancel()
                reply.cancel()
            stopped.cancel()
        return Response(answer_body, status_code=status, headers=dict(answer_headers))
