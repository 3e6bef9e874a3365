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
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from retrieval_server.app import BodyTooLarge, problem, receive_body, too_large
from retrieval_server.config import ServerConfig
from retrieval_server.launch import RETRIEVAL_DEPLOYMENT, deployment_cause

logger = logging.getLogger(__name__)

# How often the front asks Serve for the retrieval replicas' states: a request arriving in the moment between a
# death and the next look waits in Serve's router until the look sees it (then it is refused).
STATUS_POLL_S = 0.5
# Beyond the replica's own bound (--request-timeout-s, its 503 comes first): reading the body, two handle hops.
FORWARD_MARGIN_S = 2.0
RETRY_LATER = {"Retry-After": "1"}


@dataclass
class ReplicaView:
    """The retrieval deployment as Serve last reported it: how many replicas run, and why not when none does."""

    running: int | None = None  # None: not looked at yet (the front then forwards, as Serve's proxy would)
    cause: str = ""

    def update(self, running: int, message: str, status: str) -> None:
        self.running, self.cause = running, deployment_cause(message, status)

    def refusal(self) -> str | None:
        """The 503's detail while no retrieval replica runs; None while requests can go through."""
        if self.running != 0:
            return None
        return f"no retrieval replica is running ({self.cause}); retry later"


# A plain HTTP deployment (Serve calls it with each request), not FastAPI: Serve allows one FastAPI ingress per app.
@serve.deployment(name="PythonProxyFront", ray_actor_options={"num_cpus": 0})
class PythonProxyFront:
    def __init__(self, retrieval: DeploymentHandle, config: dict[str, Any]) -> None:
        self.retrieval = retrieval
        self.config = ServerConfig.model_validate(config)
        self.app_name = serve.get_replica_context().app_name
        self.view = ReplicaView()
        self.none_running = asyncio.Event()  # set while the view says no replica runs: wakes requests waiting
        self.poller: asyncio.Task | None = None

    async def _poll(self) -> None:
        while True:
            try:
                status = await asyncio.to_thread(serve.status)  # a controller call: off the event loop
                deployment = status.applications[self.app_name].deployments[RETRIEVAL_DEPLOYMENT]
                self.view.update(deployment.replica_states.get("RUNNING", 0), deployment.message, deployment.status)
            except Exception:  # a controller restarting, the app being deleted: look again next time
                logger.warning("could not read the retrieval deployment's status", exc_info=True)
            if self.view.refusal() is None:
                self.none_running.clear()
            else:
                self.none_running.set()
            await asyncio.sleep(STATUS_POLL_S)

    async def __call__(self, request: Request) -> Response:
        if self.poller is None:  # started here: the replica's event loop runs requests, not the constructor
            self.poller = asyncio.ensure_future(self._poll())
        if (refusal := self.view.refusal()) is not None:
            return problem(503, refusal, headers=RETRY_LATER)
        try:
            body = await receive_body(request, self.config.max_body_bytes)
        except BodyTooLarge as err:
            return too_large(err)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.scope["headers"]]
        path = request.scope["path"].removeprefix(request.scope.get("root_path", "")) or "/"  # below the route prefix
        answer = self.retrieval.forwarded.remote(request.method, path, request.url.query, headers, body)
        reply, stopped = asyncio.ensure_future(answer), asyncio.ensure_future(self.none_running.wait())
        bound_s = self.config.request_timeout_s + FORWARD_MARGIN_S
        try:
            done, _ = await asyncio.wait({reply, stopped}, timeout=bound_s, return_when=asyncio.FIRST_COMPLETED)
            if reply not in done:  # held in Serve's router (no replica) or in a replica that does not answer
                answer.cancel()
                late = f"the retrieval replica did not answer within {bound_s:g} s; retry later"
                detail = self.view.refusal() or late
                return problem(503, detail, headers=RETRY_LATER)
            status, answer_headers, answer_body = reply.result()
        except Exception as err:  # the replica died under the request (RayActorError, ActorUnavailableError, ...)
            said = str(err).strip().splitlines()
            cause = f"{type(err).__name__}: {said[0]}" if said else type(err).__name__
            return problem(503, f"the retrieval replica stopped while answering this request ({cause}); retry later",
                           headers=RETRY_LATER)  # fmt: skip
        finally:
            reply.cancel()
            stopped.cancel()
        return Response(answer_body, status_code=status, headers=dict(answer_headers))
