"""`serve --replica-resource NAME=AMOUNT`: what pins the server's replicas to the nodes that offer a Ray resource."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from retrieval_server.cli import _resources
from retrieval_server.cli import app as server_app


def test_pairs_become_the_resources_each_replica_asks_for() -> None:
    assert _resources(["retrieval_host=1", "big_memory = 0.5"]) == {"retrieval_host": 1.0, "big_memory": 0.5}
    assert _resources([]) == {}


@pytest.mark.parametrize("pair", ["retrieval_host", "retrieval_host=lots", "=1", "retrieval_host=0"])
def test_a_malformed_pair_is_a_usage_error_naming_it(pair: str) -> None:
    with pytest.raises(typer.BadParameter, match="--replica-resource|NAME=AMOUNT|amount above 0"):
        _resources([pair])
    result = CliRunner().invoke(server_app, ["serve", "--index-dir", "/nonexistent", "--replica-resource", pair])
    assert result.exit_code == 2 and repr(pair) in result.output and "Traceback" not in result.output


def test_a_good_pair_passes_on_to_the_index_checks(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        server_app, ["serve", "--index-dir", str(tmp_path / "none"), "--replica-resource", "retrieval_host=1"]
    )
    assert result.exit_code == 2 and "no index manifest" in result.output
