"""The retrieval deployment as Serve knows it: its name, its health-check period and its status on one line.

Shared by the launcher (:mod:`retrieval_server.launch`) and the Python front (:mod:`retrieval_server.python_front`),
which watches the replicas' states.
"""

from __future__ import annotations

RETRIEVAL_DEPLOYMENT = "RetrievalServer"  # the deployment's name in app.py; its replicas' actors carry it
# Seconds between Serve's health checks of a replica (Serve's default: 10).
REPLICA_HEALTH_CHECK_PERIOD_S = 2.0


def deployment_cause(message: str, status: str) -> str:
    """Serve's message about a deployment on one line: its first sentence and the exception (the traceback's last
    line), or the status when Serve recorded no message."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    if not lines:
        return f"status {status}"
    return lines[0] if len(lines) < 2 else f"{lines[0]} {lines[-1]}"
