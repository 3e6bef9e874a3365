"""What Ray Serve says of the retrieval server while it is not ready, for recipes/slurm/train.sbatch's wait.

Run on the server's Ray: the training cluster (RAY_ADDRESS), or, without RAY_ADDRESS, the Ray instance the server
started on its own node (found through the GCS port its session directory records: that Ray writes no address file).
Prints one line. Exits 3 when Serve cannot place a replica, the line then Serve's own reason (the resources a replica
needs and those the cluster has left); 0 otherwise (still starting, or running: nothing to report).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

CANNOT_PLACE = 3


def server_ray_address() -> str | None:
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    temp_dir = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()  # where Ray keeps its sessions, as Ray picks it
    ports = sorted(Path(temp_dir, "ray", "session_latest").glob("gcs_server_port_*"))
    if not ports:
        return None
    # The server's Ray listens on loopback only (retrieval_server/launch.py); a driver joins it there only when Ray
    # is told the cluster stays on this machine (else it swaps 127.0.0.1 for the machine's outward address).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return f"127.0.0.1:{ports[0].read_text().strip()}"


def main() -> int:
    address = server_ray_address()
    if address is None:
        print("no Ray session on this node yet")
        return 0
    import ray
    from ray import serve

    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    try:
        applications = serve.status().applications
    except Exception as err:  # Serve not started yet: nothing to explain
        print(f"Serve is not running yet ({type(err).__name__})")
        return 0
    for app_name, application in applications.items():
        for name, deployment in application.deployments.items():
            message = " ".join((deployment.message or "").split())
            # Serve's message for a replica no node can take (ray/serve/_private/deployment_state.py)
            if "to be scheduled" in message and "Resources required for each replica" in message:
                reason = message[message.index("Resources required") :].split(" Use `ray status`")[0]
                print(f"Serve cannot place a replica of {app_name}/{name}: {reason}")
                return CANNOT_PLACE
    print("; ".join(f"{name}: {app.status}" for name, app in applications.items()) or "no application yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
