"""Tiny offline models and tokenizer for CPU tests, benchmarks and the demo.

No hub access is needed: the tokenizer is a byte-level BPE trained in a few
milliseconds on a fixed text (so any string round-trips exactly through
encode/decode), with a ChatML chat template like Qwen's; the models are
randomly initialised from transformers configs. The real loading code paths
(``AutoTokenizer.from_pretrained(dir)``, ``AutoModel...from_pretrained(dir)``)
are exercised by saving these to a directory first.
"""

from __future__ import annotations

import copy
import functools
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


@functools.lru_cache(maxsize=4)
def tiny_tokenizer(vocab_size: int = 600):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with a ChatML template.

    Lossless: ``decode(encode(s)) == s`` for any string, which the reward and
    rollout tests rely on when they decode responses.
    """
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
    core.train_from_iterator([_TRAINING_TEXT] * 4, trainer=trainer)
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


class ThreadedUvicorn:
    """A FastAPI app served by uvicorn in a daemon thread on 127.0.0.1, for tests and stand-ins.

    The listening socket is bound here, before the thread starts, and handed to
    uvicorn: there is no window between choosing a port and binding it in which
    another server can take it (``free_port()`` then ``bind`` had one). Start-up
    waits at most ``start_timeout`` seconds and raises if uvicorn never serves
    (its thread dies on an error, e.g. a bad app).
    """

    def __init__(self, app, host: str = "127.0.0.1", start_timeout: float = 30.0) -> None:
        import socket
        import threading
        import time

        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout
        while not self.server.started:
            if not self.thread.is_alive():
                self.socket.close()
                raise RuntimeError(f"uvicorn on {self.url} exited during start-up (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"uvicorn on {self.url} did not start within {start_timeout:.0f} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()

    def __enter__(self) -> ThreadedUvicorn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OpenAICompatibleServer:
    """A scripted stand-in for a vLLM server, for CPU tests and examples.

    Speaks vLLM's OpenAI protocol on 127.0.0.1 (uvicorn, a background thread):
    ``/v1/completions`` with token-id prompts and vLLM's ``token_ids`` in each
    choice, and ``/v1/chat/completions``. The "model" always writes
    ``completion_text`` / ``chat_reply``, cut at the first requested stop
    string as vLLM does. Every request body is kept in ``requests``.
    """

    def __init__(
        self,
        tokenizer,
        completion_text: str = "<answer> Nile </answer> after",
        chat_reply: str = "<reason> r </reason><extract> The Nile is the longest river. </extract> more",
        return_token_ids: bool = True,
    ) -> None:
        from fastapi import FastAPI

        app = FastAPI()
        self.requests: list[dict] = []
        self.completion_text = completion_text
        self.chat_reply = chat_reply

        def cut(text: str, body: dict) -> tuple[str, str | None]:
            for stop in body.get("stop") or []:
                if stop in text:
                    keep = text.index(stop) + (len(stop) if body.get("include_stop_str_in_output") else 0)
                    return text[:keep], stop
            return text, None

        @app.post("/v1/completions")
        async def completions(body: dict):
            self.requests.append(body)
            text, stop = cut(self.completion_text, body)
            choice = {"index": 0, "text": text, "finish_reason": "stop", "stop_reason": stop, "logprobs": None}
            if return_token_ids:
                choice["token_ids"] = tokenizer.encode(text, add_special_tokens=False)
            return {"id": "c", "object": "text_completion", "created": 0, "model": body["model"], "choices": [choice]}

        @app.post("/v1/chat/completions")
        async def chat(body: dict):
            self.requests.append(body)
            text, _ = cut(self.chat_reply, body)
            message = {"role": "assistant", "content": text}
            return {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }

        self._http = ThreadedUvicorn(app)
        self.url = self._http.url

    def stop(self) -> None:
        self._http.stop()
