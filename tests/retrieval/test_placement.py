"""Where Ray may place the server's replicas: the custom resources that pin them to their nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from retrieval_server.config import ServerConfig
from retrieval_server.launch import replica_actor_options


def test_replicas_ask_for_the_custom_resources_they_are_given(tmp_path: Path):
    config = ServerConfig(index_dir=tmp_path, num_cpus_per_replica=4, replica_resources={"retrieval_host": 1})
    assert replica_actor_options(config) == {"num_cpus": 4.0, "num_gpus": 0.0, "resources": {"retrieval_host": 1.0}}


def test_without_custom_resources_replicas_ask_only_for_cpus_and_gpus(tmp_path: Path):
    assert "resources" not in replica_actor_options(ServerConfig(index_dir=tmp_path))


def test_a_resource_amount_must_be_a_number(tmp_path: Path):
    with pytest.raises(ValidationError, match="replica_resources"):
        ServerConfig(index_dir=tmp_path, replica_resources={"retrieval_host": "many"})
