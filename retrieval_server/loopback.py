"""The one Ray Serve listener Ray's node address does not decide: each replica's inter-deployment gRPC server.

Ray Serve 2.60 starts it in every replica on ``[::]:0`` (every interface; ``ray/serve/_private/replica.py``,
``_on_initialized``), with no setting to change it, so on a cluster whose node is on loopback (``launch.py`` starts
its own that way) it was the last port listening beyond it. :func:`keep_grpc_on_loopback` runs in each worker of that
cluster (Ray's ``worker_process_setup_hook``) before Serve's replica module is imported, which takes
``add_port_to_grpc_server`` by name: a wildcard gRPC address becomes 127.0.0.1 while the node's address is loopback.
Ray 2.60; tests/retrieval/test_side_doors.py fails if a later Serve listens beyond loopback again.
"""

from __future__ import annotations

import sys

_WILDCARDS = ("[::]:", "0.0.0.0:", "[::0]:")


def keep_grpc_on_loopback() -> None:
    from ray._common import tls_utils

    add_port = tls_utils.add_port_to_grpc_server
    if getattr(add_port, "keeps_loopback", False):
        return

    def add_port_on_loopback(server, address: str):
        import ray
        from ray._common.network_utils import is_localhost

        if address.startswith(_WILDCARDS) and is_localhost(ray.util.get_node_ip_address()):
            address = "127.0.0.1:" + address.rsplit(":", 1)[1]
        return add_port(server, address)

    add_port_on_loopback.keeps_loopback = True
    tls_utils.add_port_to_grpc_server = add_port_on_loopback
    replica = sys.modules.get("ray.serve._private.replica")
    if replica is not None:  # imported before this hook ran (a preloaded module): it holds the old name
        replica.add_port_to_grpc_server = add_port_on_loopback
