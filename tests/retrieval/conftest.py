"""Fixtures shared by the retrieval tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory) -> str:
    """A randomly initialised 2-layer BERT cross-encoder with MiniLM's vocabulary, saved locally (no hub access)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from retrieval_server.config import packaged_minilm_path

    directory = tmp_path_factory.mktemp("tiny-ce")
    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_path())
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)
