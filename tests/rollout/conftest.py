"""Fixtures for the rollout tests: verl's real config, verl's AgentLoopWorker, the real retrieval server.

Loops are driven the way the trainer drives them: ``AgentLoopWorker`` built
from a Hydra-composed ``ppo_trainer.yaml`` (model path = a tiny saved model),
``generate_sequences(DataProto)`` instantiating each loop from verl's registry
by the row's ``agent_name``. Only the inference engine is replaced, by a
backend behind verl's own ``LLMServerClient`` interface.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from rollout_helpers import RESPONSE_LENGTH

PROMPT_LENGTH = 8192


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    from verl_evidence.local.tiny_models import tiny_causal_lm

    directory = tmp_path_factory.mktemp("tiny_lm")
    tiny_causal_lm(seed=0, directory=directory)
    return directory


@pytest.fixture(scope="session")
def base_config(model_dir):
    """verl's ppo_trainer.yaml composed by Hydra, as the trainer would see it."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from verl_evidence.registration import AGENT_LOOPS, register_all

    register_all(AGENT_LOOPS)  # what importing verl's agent-loop package does in every worker
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.rollout.name=vllm",
                f"data.max_prompt_length={PROMPT_LENGTH}",
                f"data.max_response_length={RESPONSE_LENGTH}",
            ],
        )


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def search_url(request) -> str:
    """The session's real retrieval server (tests/conftest.py), or one started here over the bundled corpus."""
    if os.environ.get("VERL_EVIDENCE_TEST_RETRIEVAL_URL"):  # a server the developer keeps running
        return os.environ["VERL_EVIDENCE_TEST_RETRIEVAL_URL"]
    try:
        return request.getfixturevalue("retrieval_server_url")
    except pytest.FixtureLookupError:
        pass
    from retrieval_server.launch import default_server_config, start_server
    from verl_evidence import bundled

    handle = start_server(default_server_config(bundled.corpus_path(), port=0), ray_num_cpus=2)
    request.addfinalizer(handle.shutdown)
    return handle.url


class Vocab(NamedTuple):
    """One policy vocabulary the loops run on: its name, tokenizer and the verl config whose model path holds it."""

    name: str
    tokenizer: object
    config: object

    def __repr__(self) -> str:  # hypothesis prints the fixtures of a failing example: the name says it
        return f"Vocab({self.name!r})"


@pytest.fixture(scope="session")
def qwen_model_dir(model_dir, tmp_path_factory) -> Path:
    """The tiny model's config beside Qwen2.5's real tokenizer (verl's worker reads both from the model path; the
    scripted engine never runs the model)."""
    import shutil

    from verl_evidence.local.qwen_tokenizer import qwen_tokenizer_dir

    directory = tmp_path_factory.mktemp("qwen_vocab")
    shutil.copy(model_dir / "config.json", directory / "config.json")
    for path in qwen_tokenizer_dir("qwen2.5").iterdir():
        shutil.copy(path, directory / path.name)
    return directory


@pytest.fixture(scope="session", params=["test", "qwen2.5"])
def vocab(request, base_config, tokenizer) -> Vocab:
    """Each vocabulary in turn: the offline test tokenizer (a ~500-token byte BPE) and Qwen2.5's 151k-token BPE,
    whose tokens glue tags to what follows (``'><'``, ``'>The'``, ``'>\\n\\n'``)."""
    if request.param == "test":
        return Vocab("test", tokenizer, base_config)
    from rollout_helpers import with_settings
    from transformers import AutoTokenizer

    directory = request.getfixturevalue("qwen_model_dir")
    config = with_settings(base_config, {"actor_rollout_ref.model.path": str(directory)})
    return Vocab(request.param, AutoTokenizer.from_pretrained(directory), config)
