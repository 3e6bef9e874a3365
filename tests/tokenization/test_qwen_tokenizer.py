"""The offline Qwen2.5/Qwen3 tokenizer (verl_evidence/local/qwen_tokenizer.py): known ids, the package's own encoder's
ids on varied texts, lossless round trips, and the chat templates' output against the documented ChatML format."""

from __future__ import annotations

import json
import random
import unicodedata

import pytest
from transformers import PreTrainedTokenizerFast

from verl_evidence.bundled import load_corpus, load_qa
from verl_evidence.local import qwen_tokenizer as builder
from verl_evidence.prompts import PROMPT_DIR

QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the corpus.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    return builder.qwen_tokenizer("qwen3")


@pytest.fixture(scope="module")
def package_encoder():
    """The package's own tiktoken encoder of the same ranks (Qwen2.5 uses its legacy file)."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")


def test_known_ids(qwen_tokenizer, qwen3_tokenizer):
    assert isinstance(qwen_tokenizer, PreTrainedTokenizerFast)
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657}
    for name, token_id in expected.items():
        assert qwen_tokenizer.convert_tokens_to_ids(name) == token_id
        assert qwen_tokenizer.encode(name, add_special_tokens=False) == [token_id]
        assert qwen3_tokenizer.encode(name, add_special_tokens=False) == [token_id]
    assert qwen3_tokenizer.encode("<think>x</think>", add_special_tokens=False) == [151667, 87, 151668]
    assert qwen3_tokenizer.convert_tokens_to_ids(["<tool_response>", "</tool_response>"]) == [151665, 151666]
    assert qwen_tokenizer.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    # Qwen2.5 has no <think> token: the text splits into ordinary tokens.
    assert len(qwen_tokenizer.encode("<think>", add_special_tokens=False)) > 1
    assert len(qwen_tokenizer) == 151643 + 22 and len(qwen3_tokenizer) == 151643 + 26
    assert (qwen_tokenizer.eos_token, qwen_tokenizer.pad_token, qwen_tokenizer.bos_token) == (
        "<|im_end|>",
        "<|endoftext|>",
        None,
    )
    assert qwen3_tokenizer.eos_token_id == 151645 and qwen3_tokenizer.pad_token_id == 151643


def test_special_and_plain_added_tokens(qwen_tokenizer, qwen3_tokenizer):
    """Control tokens vanish with skip_special_tokens; tool-call and think tags are text to the model and stay."""
    ids = qwen_tokenizer.encode("<|im_start|>a<tool_call>b</tool_call><|im_end|>", add_special_tokens=False)
    assert qwen_tokenizer.decode(ids, skip_special_tokens=True) == "a<tool_call>b</tool_call>"
    ids = qwen3_tokenizer.encode("<think>r</think>ok<|im_end|>", add_special_tokens=False)
    assert qwen3_tokenizer.decode(ids, skip_special_tokens=True) == "<think>r</think>ok"


@pytest.mark.parametrize("text", [">\n\n", ">The", ">.", "><"])
def test_a_tag_end_merges_with_what_follows(qwen_tokenizer, text):
    assert len(qwen_tokenizer.encode(text, add_special_tokens=False)) == 1


def test_merges_are_derived_not_guessed():
    """Every multi-byte token is one merge of two lower-ranked tokens that re-form it."""
    ranks = builder.bpe_ranks()
    merges = builder.derive_merges(ranks)
    assert len(ranks) == 151643 and len(merges) == 151643 - 256
    for left, right in merges[::997]:
        assert ranks[left] < ranks[left + right] and ranks[right] < ranks[left + right]


def _varied_texts(seed: int = 52, count: int = 2500) -> list[str]:
    """Random mixes of the character classes the split regex and byte-level BPE treat differently."""
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r\u00a0\u3000",
        "<>/.,;:!?'\"()[]{}-_=+*&^%$#@~`|\\",
        "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长",
        "日本語のテキストとカタカナ한국어텍스트",
        "éèêëàâäôöûüçñßøåæ",
        "🙂🚀👍🏽👨‍👩‍👧‍👦🇫🇷✨",
        "'s't're've'm'll'd",
        "Ω≈ç√∫µ≤≥÷€£¥",
    ]
    words = ["<answer>", "</answer>", "<extract>", "</extract>", "The", "the", "def", "return", "    ", "\n\n", "''"]
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        pieces = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.3:
                pieces.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                pieces.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        texts.append("".join(pieces))
    return texts


def _project_texts() -> list[str]:
    prompts = [path.read_text(encoding="utf-8") for path in sorted(PROMPT_DIR.glob("*.txt"))]
    passages = [row["contents"] for row in load_corpus()]
    questions = [json.dumps(row, ensure_ascii=False) for row in load_qa()]
    code = [path.read_text(encoding="utf-8") for path in sorted((PROMPT_DIR.parent / "text").glob("*.py"))]
    return prompts + passages + questions + code


def test_ids_agree_with_the_package_encoder(qwen_tokenizer, package_encoder):
    """Plain text only: the package's Qwen2.5 encoder knows Qwen1's added tokens, not Qwen2.5's (<tool_call> ...)."""
    texts = _varied_texts() + _project_texts()
    assert not [text for text in texts if any(name in text for name in builder.added_tokens("qwen2.5"))]
    ours = qwen_tokenizer(texts, add_special_tokens=False)["input_ids"]
    differing = [text[:80] for text, ids in zip(texts, ours) if ids != package_encoder.encode(text)]
    assert len(texts) > 2500 and not differing, f"{len(differing)} of {len(texts)} texts differ, e.g. {differing[:3]!r}"


def test_decode_inverts_encode(qwen_tokenizer):
    texts = _varied_texts(seed=7, count=1000) + _project_texts()
    encoded = qwen_tokenizer(texts, add_special_tokens=False)["input_ids"]
    decoded = qwen_tokenizer.batch_decode(encoded)
    assert decoded == [unicodedata.normalize("NFC", text) for text in texts]


def test_loads_from_its_directory_as_a_tokenizer_path(qwen_tokenizer):
    """The fixture's tokenizer is AutoTokenizer.from_pretrained of the cached directory (no second 2-s load here)."""
    directory = builder.qwen_tokenizer_dir()
    assert {"tokenizer.json", "tokenizer_config.json"} <= {path.name for path in directory.iterdir()}
    assert qwen_tokenizer.name_or_path == str(directory)
    assert qwen_tokenizer.chat_template == builder.chat_template("qwen2.5")
    assert json.loads((directory / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="unknown Qwen tokenizer family 'qwen1'"):
        builder.qwen_tokenizer("qwen1")


def _render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_qwen25_template_default_and_given_system(qwen_tokenizer):
    user = [{"role": "user", "content": "Who wrote it?"}]
    assert _render(qwen_tokenizer, user) == (
        f"<|im_start|>system\n{QWEN25_SYSTEM}<|im_end|>\n<|im_start|>user\nWho wrote it?<|im_end|>\n"
    )
    given = [{"role": "system", "content": "Be brief."}, *user]
    assert _render(qwen_tokenizer, given, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho wrote it?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen25_template_multi_turn(qwen_tokenizer):
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert _render(qwen_tokenizer, messages, add_generation_prompt=True) == (
        f"<|im_start|>system\n{QWEN25_SYSTEM}<|im_end|>\n<|im_start|>user\na<|im_end|>\n"
        "<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen25_template_tools_call_and_responses(qwen_tokenizer):
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": "Nile"}}}
    messages = [
        {"role": "user", "content": "Longest river?"},
        {"role": "assistant", "content": "Searching.", "tool_calls": [call, call]},
        {"role": "tool", "content": "Doc 1"},
        {"role": "tool", "content": "Doc 2"},
    ]
    tool_call = '\n<tool_call>\n{"name": "search", "arguments": {"query": "Nile"}}\n</tool_call>'
    assert _render(qwen_tokenizer, messages, tools=[TOOL], add_generation_prompt=True) == (
        f"<|im_start|>system\n{QWEN25_SYSTEM}\n\n{TOOLS_HEADER}{json.dumps(TOOL, ensure_ascii=False)}{TOOLS_FOOTER}"
        "<|im_end|>\n<|im_start|>user\nLongest river?<|im_end|>\n"
        f"<|im_start|>assistant\nSearching.{tool_call}{tool_call}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nDoc 1\n</tool_response>\n<tool_response>\nDoc 2\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen3_template(qwen3_tokenizer):
    user = [{"role": "user", "content": "q"}]
    assert _render(qwen3_tokenizer, user, add_generation_prompt=True) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _render(qwen3_tokenizer, user, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # An earlier turn's reasoning is dropped; the last reply keeps its think block.
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>\nr2\n</think>\n\na2"},
    ]
    assert _render(qwen3_tokenizer, messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n"
    )
    call = {"type": "function", "function": {"name": "search", "arguments": '{"query": "Nile"}'}}
    with_tools = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "Doc"},
    ]
    assert _render(qwen3_tokenizer, with_tools, tools=[TOOL]) == (
        f"<|im_start|>system\nS\n\n{TOOLS_HEADER}{json.dumps(TOOL, ensure_ascii=False)}{TOOLS_FOOTER}<|im_end|>\n"
        "<|im_start|>user\nq<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "Nile"}}'
        "\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nDoc\n</tool_response><|im_end|>\n"
    )
