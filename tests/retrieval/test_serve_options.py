"""``serve``'s options are ServerConfig's fields: names, defaults, help and ranges come from the model (fast tier)."""

from __future__ import annotations

import pytest
import typer.main

from retrieval_server import cli
from retrieval_server.config import ServerConfig

# Every option serve had before its options were derived, as docs/retrieval-server.md and the recipes use them.
DOCUMENTED = [
    "index-dir",
    "corpus",
    "model",
    "method",
    "topk",
    "rerank-model",
    "rerank-top-n",
    "search-params",
    "mmap-index",
    "host",
    "port",
    "ingress",
    "address",
    "replicas",
    "cpus-per-replica",
    "gpus-per-replica",
    "replica-resource",
    "torch-threads",
    "encoder-backend",
    "encode-threads",
    "max-batch-size",
    "batch-concurrency",
    "batch-wait-ms",
    "max-queries-per-request",
    "max-topk",
    "max-query-chars",
    "max-body-bytes",
    "max-batch-queries",
    "max-batch-hits",
    "max-queued-queries",
    "request-timeout-s",
    "result-cache-size",
    "client-timeout-s",
    "http-request-timeout-s",
    "max-connections-per-client",
    "max-unsent-answer-bytes",
    "small-request-queries",
    "max-replica-restarts",
    "expose-python-proxy",
    "token",
    "token-file",
    "access-log",
]


@pytest.fixture(scope="module")
def options() -> dict:
    command = typer.main.get_command(cli.app).commands["serve"]
    return {param.opts[0]: param for param in command.params if param.param_type_name == "option"}


def test_every_field_is_an_option_with_its_default_help_and_range(options):
    for name, field in ServerConfig.model_fields.items():
        if name in cli.SERVE_OWN_FIELDS:
            continue
        option = options.get("--" + cli.SERVE_OPTION_NAMES.get(name, name).replace("_", "-"))
        assert option is not None, f"ServerConfig.{name} has no serve option"
        assert option.default == field.get_default(call_default_factory=True), name
        assert option.help.startswith(field.description), name
        ge = next((rule.ge for rule in field.metadata if getattr(rule, "ge", None) is not None), None)
        if ge is not None:
            assert option.min == ge, name


def test_the_documented_names_still_work(options):
    assert sorted(set(DOCUMENTED) - {name.removeprefix("--") for name in options}) == []


def test_a_refused_value_names_its_option():
    from typer.testing import CliRunner

    result = CliRunner().invoke(cli.app, ["serve", "--index-dir", ".", "--cpus-per-replica", "0"])
    assert result.exit_code == 2
    assert "--cpus-per-replica=0.0" in result.output, result.output


def test_each_option_reaches_its_field(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import retrieval_server.launch as launch

    started = {}

    def record(config, address=None):
        started["config"] = config
        raise SystemExit(0)

    monkeypatch.setattr(launch, "start_server", record)
    given = ["--topk", "5", "--replicas", "2", "--cpus-per-replica", "1.5", "--batch-wait-ms", "3"]
    given += ["--replica-resource", "retrieval_host=1", "--rrf-k", "7", "--no-use-gpu-index", "--port", "0"]
    result = CliRunner().invoke(cli.app, ["serve", "--index-dir", str(tmp_path), *given])
    assert result.exit_code == 0, result.output
    config = started["config"]
    assert (config.default_topk, config.num_replicas, config.num_cpus_per_replica) == (5, 2, 1.5)
    assert (config.batch_wait_timeout_s, config.replica_resources) == (0.003, {"retrieval_host": 1.0})
    assert (config.rrf_k, config.use_gpu_index, config.port) == (7, False, 0)
