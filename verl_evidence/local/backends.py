"""Generation backends behind verl's server-manager interface.

verl's agent loops talk to the inference engine only through
``server_manager.generate(request_id, *, prompt_ids, sampling_params, ...) -> TokenOutput``
(:class:`verl.workers.rollout.llm_server.LLMServerClient`). The classes here
subclass that client and override ``generate`` (verl's docstring allows
subclasses that route requests themselves to pass no load balancer), so an
agent loop cannot tell whether it runs against vLLM in a trainer, a local HF
model, a script, or a remote OpenAI-compatible server:

- :class:`HFGenerationBackend` runs a Hugging Face causal LM in-process (CPU or GPU);
- :class:`ScriptedBackend` emits given texts, for exact protocol tests and replays;
- :class:`OpenAIBackend` calls an OpenAI-compatible ``/v1/completions`` endpoint
  (e.g. ``vllm serve``), and offers a text-level ``chat`` for external models
  such as the evidence extractor.

Sampling parameters follow vLLM's names, which is what verl's agent loops send:
``temperature`` (0 = greedy), ``top_p``, ``top_k`` (-1 = off), ``max_tokens``
(or SGLang's ``max_new_tokens``), ``stop`` (strings), ``stop_token_ids``,
``logprobs``. As vLLM and SGLang return them, ``token_ids`` run up to and
including the token that completes a stop string (that token may carry
characters past it: Qwen's ``'>\n\n'`` after ``</search>``), the stop token, or
the EOS token, and ``stop_reason`` is what verl's rollout server for the engine
reports (:func:`engine_stop_reason`): a loop cannot learn more here than from a
real engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from verl_evidence.agent_loops.openai_endpoint import (
    DEFAULT_MAX_TOKENS,
    OpenAIEndpoint,
    max_tokens_of,
    sampling_body,
    stop_strings_of,
)
from verl_evidence.text.stops import cut_at_stop, ends_at_stop

logger = logging.getLogger(__name__)


ENGINES = ("vllm", "sglang")


def engine_stop_reason(engine: str, ended: str) -> str:
    """``TokenOutput.stop_reason`` as verl's rollout server for ``engine`` reports a generation that ``ended`` at a
    stop string, stop token or EOS (``"stop"``) or at ``max_tokens`` (``"length"``).

    verl's vLLM server reports both as ``"completed"`` (vllm_async_server.py: finish reasons stop and length);
    its SGLang server passes SGLang's finish-reason type on (``"stop"`` for EOS, stop tokens and stop strings
    alike). Neither says whether a stop *string* was hit: the loops read that from the ids.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    return "completed" if engine == "vllm" else ended


def _stop_token_ids(sampling_params: dict[str, Any], eos_token_id: int | None) -> set[int]:
    ids = {int(t) for t in (sampling_params.get("stop_token_ids") or [])}
    if eos_token_id is not None and not sampling_params.get("ignore_eos", False):
        ids.add(int(eos_token_id))
    return ids


class _OwnRoutingClient(LLMServerClient):
    """An ``LLMServerClient`` that generates itself instead of through verl's load balancer."""

    def __init__(self, config: Any = None, engine: str = "vllm") -> None:
        super().__init__(config=config, load_balancer_handle=None)
        engine_stop_reason(engine, "stop")  # an unknown engine fails here, naming it
        self.engine = engine  # whose stop_reason this backend reports (engine_stop_reason)
        self.calls: list[dict[str, Any]] = []
        self.record_calls = False
        # The weight version the "engine" generates with. verl's rollout servers report it in
        # every TokenOutput and its client adds min/max_global_steps; the trainer needs all three.
        self.global_steps: int = 0

    def _engine_fields(self) -> dict[str, Any]:
        steps = self.global_steps
        return {"global_steps": steps, "min_global_steps": steps, "max_global_steps": steps}

    def _record(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]) -> None:
        if self.record_calls:
            self.calls.append(
                {"request_id": request_id, "prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)}
            )


class ScriptedBackend(_OwnRoutingClient):
    """Emits scripted texts as if a model had generated them.

    Either ``turns`` (consumed one per ``generate`` call, in call order) or
    ``responder`` (called with the decoded prompt, returns the text; use it
    when calls run concurrently) supplies the text. Stop strings, stop tokens
    and ``max_tokens`` are honoured exactly like a real engine would: the text
    is cut after the token that completes the first stop string. A text that
    runs to its end without a stop gets the EOS token appended (``append_eos``),
    as a model ends its turn.
    """

    def __init__(
        self,
        tokenizer,
        turns: Sequence[str] | None = None,
        responder: Callable[[str], str] | None = None,
        append_eos: bool = True,
        record_calls: bool = True,
        engine: str = "vllm",
    ) -> None:
        if (turns is None) == (responder is None):
            raise ValueError("ScriptedBackend needs exactly one of `turns` or `responder`")
        super().__init__(engine=engine)
        self.tokenizer = tokenizer
        self._turns = list(turns) if turns is not None else None
        self._responder = responder
        self.append_eos = append_eos
        self.record_calls = record_calls

    @property
    def remaining_turns(self) -> int:
        return len(self._turns) if self._turns is not None else 0

    async def generate(
        self,
        request_id,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        self._record(request_id, prompt_ids, sampling_params)
        if self._turns is not None:
            if not self._turns:
                raise RuntimeError("ScriptedBackend ran out of scripted turns")
            text = self._turns.pop(0)
        else:
            text = self._responder(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        token_ids = self.tokenizer.encode(text, add_special_tokens=False)
        eos = self.tokenizer.eos_token_id
        if self.append_eos and eos is not None:
            token_ids = token_ids + [eos]
        token_ids, ended = cut_at_stop(
            token_ids, self.tokenizer, stop_strings_of(sampling_params), _stop_token_ids(sampling_params, eos)
        )
        limit = max_tokens_of(sampling_params, DEFAULT_MAX_TOKENS)
        if len(token_ids) > limit:
            token_ids, ended = token_ids[:limit], "length"
        log_probs = [0.0] * len(token_ids) if sampling_params.get("logprobs") else None
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason=engine_stop_reason(self.engine, ended),
            extra_fields=self._engine_fields(),
        )


def sample_until_stopped(
    model,
    input_ids,
    attention_mask,
    limits: Sequence[int],
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    stopped: Callable[[list[int]], bool],
    logprobs: bool = False,
    generators: Sequence[Any] | None = None,
) -> tuple[list[list[int]], list[list[float] | None]]:
    """Decode a left-padded batch token by token, each row until ``stopped`` says so or it has ``limits[row]``
    tokens; a row that ends leaves the batch (its KV cache rows are dropped).

    transformers' ``generate`` keeps finished rows in the batch until the last one ends, so one long reply makes
    every short one pay for its length (the smoke EviOmni rollout: most answers end within ~20 tokens of a
    batch that runs to ~140). Sampling is ``generate``'s: temperature, then top-k, then top-p warpers on the
    float32 logits, a multinomial draw (argmax when ``temperature`` is 0); ``logprobs`` are the log-softmax of
    the warped scores at the drawn tokens (``generate``'s ``output_scores``). ``generators``: one
    ``torch.Generator`` per row, so that a row's draws depend on its own generator only, not on which other rows
    share its batch (None: torch's global generator, one draw for the whole batch). Returns, per row, its generated
    ids and (with ``logprobs``) their log-probs.
    """
    import torch
    from transformers import DynamicCache, LogitsProcessorList
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = LogitsProcessorList()
    if temperature > 0:
        if temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(temperature))
        if top_k > 0:
            warpers.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
    batch = input_ids.shape[0]
    generated: list[list[int]] = [[] for _ in range(batch)]
    scores: list[list[float] | None] = [[] if logprobs else None for _ in range(batch)]
    rows = [row for row in range(batch) if limits[row] > 0]  # the batch row each cache row belongs to
    if not rows:
        return generated, scores
    if len(rows) < batch:
        input_ids, attention_mask = input_ids[rows], attention_mask[rows]
    cache = DynamicCache(config=model.config)
    # Left padding: positions count real tokens only (as generate's prepare_inputs_for_generation)
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, past_key_values=cache, **last_only
    ).logits[:, -1, :]
    next_position = positions[:, -1:] + 1
    while rows:
        warped = warpers(None, logits.float())
        if temperature > 0 and generators is not None:
            probs = torch.softmax(warped, dim=-1)
            tokens = torch.cat(
                [torch.multinomial(probs[i], num_samples=1, generator=generators[row]) for i, row in enumerate(rows)]
            )
        elif temperature > 0:
            tokens = torch.multinomial(torch.softmax(warped, dim=-1), num_samples=1).squeeze(1)
        else:
            tokens = warped.argmax(dim=-1)
        token_scores = (
            torch.log_softmax(warped, dim=-1).gather(1, tokens[:, None]).squeeze(1).tolist() if logprobs else None
        )
        keep = []
        for index, (row, token) in enumerate(zip(rows, tokens.tolist())):
            generated[row].append(token)
            if token_scores is not None:
                scores[row].append(token_scores[index])
            if len(generated[row]) < limits[row] and not stopped(generated[row]):
                keep.append(index)
        if not keep:
            break
        if len(keep) < len(rows):
            kept = torch.tensor(keep, device=input_ids.device)
            cache.batch_select_indices(kept)
            tokens, attention_mask, next_position = tokens[kept], attention_mask[kept], next_position[kept]
            rows = [rows[i] for i in keep]
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(rows), 1))], dim=-1)
        logits = model(
            input_ids=tokens[:, None], attention_mask=attention_mask, position_ids=next_position, past_key_values=cache
        ).logits[:, -1, :]
        next_position = next_position + 1
    return generated, scores


# The attention the CPU generation uses for grouped-query models (see share_key_value_heads)
SHARED_KV_SDPA = "verl_evidence_sdpa_shared_kv"


def _shared_kv_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' ``sdpa`` attention, with the key/value heads shared inside torch's kernel (``enable_gqa``).

    transformers copies every key/value head ``num_key_value_groups`` times whenever an attention mask is
    given (its fused-kernel caveat is CUDA's), i.e. the whole KV cache once per layer and decoding step
    of a left-padded batch. Same inputs, same kernel family, same outputs (tests/rollout/test_backends.py).
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is None or getattr(module, "num_key_value_groups", 1) == 1 or query.device.type != "cpu":
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


def share_key_value_heads(model) -> bool:
    """On CPU, run a grouped-query ``sdpa`` model's attention through :func:`_shared_kv_sdpa`; True if switched.

    Measured on the smoke policy (2 layers, 4 query and 2 key/value heads), a left-padded batch of 64
    prompts of ~1,400 tokens decoding 138 tokens: 21.0 CPU-s with transformers' sdpa, 7.4 shared.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if config._attn_implementation != "sdpa" or next(model.parameters()).device.type != "cpu" or kv_heads == heads:
        return False
    AttentionInterface.register(SHARED_KV_SDPA, _shared_kv_sdpa)
    AttentionMaskInterface.register(SHARED_KV_SDPA, sdpa_mask)  # the same masks as sdpa (unregistered: none at all)
    model.set_attn_implementation(SHARED_KV_SDPA)
    return True


_OWN_SETTINGS = ("max_tokens", "max_new_tokens", "seed")  # what each request of a batch keeps for itself


def _batch_key(sampling_params: dict[str, Any]) -> tuple:
    """What requests must share to be generated in one batch: everything but their prompt, length limit and seed."""
    return tuple(sorted((name, repr(value)) for name, value in sampling_params.items() if name not in _OWN_SETTINGS))


class _Request(NamedTuple):
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    seed: int | None  # its own generator's seed (RequestSeeds); None: torch's global generator


class RequestSeeds:
    """A seed for every request, from the backend's seed, the request's prompt and sampling settings, and how many
    requests of that prompt came before: what a request samples then depends neither on when it arrived nor on which
    requests share its batch. A request's own ``seed`` (vLLM's per-request sampling parameter) wins.

    A prompt asked n times at once (a GRPO group's samples, or two trajectories identical so far) gets its n seeds in
    the order its requests arrive: the same replies in every run, though two samples of a group may trade them.
    Request ids cannot name a sample instead: verl's trainer calls every agent loop with priority 0, so under its
    ``full_determinism`` every request is ``det-0``. A trade of a trajectory's own continuation changes nothing the
    trainer computes but the order of a sum: the two trajectories were identical so far, a group's samples sit in
    one mini-batch (verl splits batches by whole groups), and under full determinism the CPU mode orders each batch
    by prompt and sample (``verl_patches.patch_batch_order``). A side generation whose prompt trajectories that
    differ can share (EviOmni's masked-input answers) carries its own seed instead
    (``agent_loops.common.seeded_by_trajectory``): traded, it would move a reward from one sample to another.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._asked: Counter[bytes] = Counter()  # prompt digest -> requests of it so far

    def next(self, prompt_ids: Sequence[int], sampling_params: dict[str, Any]) -> int:
        if sampling_params.get("seed") is not None:
            return int(sampling_params["seed"]) & _SEED_MASK
        name = hashlib.blake2b(
            f"{self.seed}|{_batch_key(sampling_params)}|{list(prompt_ids)}".encode(), digest_size=16
        ).digest()
        count = self._asked[name]
        self._asked[name] = count + 1
        return int.from_bytes(hashlib.blake2b(name + count.to_bytes(8, "little"), digest_size=8).digest()) & _SEED_MASK


_SEED_MASK = (1 << 63) - 1  # torch.Generator.manual_seed takes a non-negative 64-bit integer


class HFGenerationBackend(_OwnRoutingClient):
    """A local Hugging Face causal LM behind verl's server-manager interface.

    Requests that arrive while a generation runs are generated together next, as
    one left-padded batch, as vLLM batches concurrent requests: a GRPO group's
    samples share the model's forward passes instead of taking turns (measured on
    the smoke policy: 16 prompts x 100 tokens in 1.5 CPU-s batched, 3.2 one by
    one). Each request keeps its own length limit and stops; requests whose other
    sampling settings differ are generated in separate batches. Batching is
    :class:`retrieval_server.batching.BacklogBatcher` (a lone request runs at once);
    generation runs in a worker thread, one batch at a time per model (HF models
    are not re-entrant), so the event loop keeps serving other trajectories.
    """

    def __init__(
        self,
        model,
        tokenizer,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        seed: int | None = 0,
        max_batch_size: int = 64,
        engine: str = "vllm",
    ) -> None:
        from retrieval_server.batching import BacklogBatcher

        super().__init__(engine=engine)
        self.model = model.eval()
        share_key_value_heads(self.model)
        self.tokenizer = tokenizer
        self.default_max_tokens = default_max_tokens
        self._lock = threading.Lock()
        self._batcher = BacklogBatcher(self._generate_batch, max_batch_size=max_batch_size)
        self.batch_sizes: Counter[int] = Counter()  # how many requests each generated batch held
        # Each request samples with a generator of its own (RequestSeeds): a run repeats with its seed, whatever
        # order its concurrent requests arrive in and however they are batched; repeated samples of one prompt
        # (a GRPO group) still differ. seed=None: torch's global generator, not repeatable.
        self.request_seeds = RequestSeeds(seed) if seed is not None else None

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, device: str | None = None, dtype: str = "auto", **kwargs):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        return cls(model, tokenizer, **kwargs)

    async def _generate_batch(self, requests: list[_Request]) -> list[TokenOutput]:
        groups: dict[tuple, list[int]] = {}
        for index, (_, sampling_params, _) in enumerate(requests):
            groups.setdefault(_batch_key(sampling_params), []).append(index)
        outputs: list[TokenOutput | None] = [None] * len(requests)
        loop = asyncio.get_running_loop()
        for indices in groups.values():
            group = [requests[i] for i in indices]
            for index, output in zip(indices, await loop.run_in_executor(None, self._generate_sync, group)):
                outputs[index] = output
        return outputs

    def _generate_sync(self, requests: list[_Request]) -> list[TokenOutput]:
        """One batch (:func:`sample_until_stopped`) for requests that share their sampling settings (not their length
        limits)."""
        import torch

        sampling_params = requests[0].sampling_params
        eos = self.tokenizer.eos_token_id
        stop_ids = _stop_token_ids(sampling_params, eos)
        stops = stop_strings_of(sampling_params)
        temperature = float(sampling_params.get("temperature", 1.0) or 0.0)
        top_k = sampling_params.get("top_k", -1)
        top_p = float(sampling_params.get("top_p", 1.0) or 1.0)
        limits = [max_tokens_of(request.sampling_params, self.default_max_tokens) for request in requests]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        device = next(self.model.parameters()).device
        # Left-padded: every row's generated tokens start at the same column.
        width = max(len(request.prompt_ids) for request in requests)
        input_ids = torch.tensor(
            [[pad or 0] * (width - len(r.prompt_ids)) + r.prompt_ids for r in requests], dtype=torch.long, device=device
        )
        attention_mask = torch.tensor(
            [[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in requests],
            dtype=torch.long,
            device=device,
        )
        generators = None
        if temperature > 0 and all(request.seed is not None for request in requests):
            generators = [torch.Generator(device=device).manual_seed(request.seed) for request in requests]
        with self._lock, torch.no_grad():
            generated, scores = sample_until_stopped(
                self.model,
                input_ids,
                attention_mask,
                limits,
                temperature=temperature,
                top_k=int(top_k) if top_k and top_k > 0 else 0,
                top_p=top_p,
                stopped=lambda generated: ends_at_stop(generated, self.tokenizer, stops, stop_ids),
                logprobs=bool(sampling_params.get("logprobs")),
                generators=generators,
            )
            self.batch_sizes[len(requests)] += 1
        outputs = []
        for new_ids, row_scores in zip(generated, scores):
            kept, ended = cut_at_stop(new_ids, self.tokenizer, stops, stop_ids)
            outputs.append(
                TokenOutput(
                    token_ids=kept,
                    log_probs=row_scores[: len(kept)] if row_scores is not None else None,
                    stop_reason=engine_stop_reason(self.engine, ended),
                    extra_fields=self._engine_fields(),
                )
            )
        return outputs

    async def generate(
        self,
        request_id,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        self._record(request_id, prompt_ids, sampling_params)
        # seeded on arrival: a prompt's n-th request is the one that arrives n-th
        seed = self.request_seeds.next(prompt_ids, sampling_params) if self.request_seeds else None
        return await self._batcher.submit(_Request(list(prompt_ids), dict(sampling_params), seed))


class OpenAIBackend(_OwnRoutingClient, OpenAIEndpoint):
    """An OpenAI-compatible completions endpoint (vLLM, SGLang, TGI ...) behind verl's interface.

    ``generate`` sends the prompt as token ids to ``/v1/completions`` and asks
    for the sampled token ids (vLLM's ``return_token_ids``); servers that do
    not return them get the text re-encoded with ``tokenizer``. ``chat``
    (from :class:`~verl_evidence.agent_loops.openai_endpoint.OpenAIEndpoint`)
    is a text-level call for models whose tokenizer differs from the policy's.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer=None,
        api_key: str = "EMPTY",
        timeout: float = 120.0,
        max_retries: int = 2,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        engine: str = "vllm",
    ) -> None:
        _OwnRoutingClient.__init__(self, engine=engine)
        OpenAIEndpoint.__init__(
            self,
            base_url,
            model,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            default_max_tokens=default_max_tokens,
        )
        self.tokenizer = tokenizer

    async def generate(
        self,
        request_id,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        self._record(request_id, prompt_ids, sampling_params)
        args, extra = sampling_body(sampling_params, self.default_max_tokens)
        extra["return_token_ids"] = True
        want_logprobs = bool(sampling_params.get("logprobs"))
        if want_logprobs:
            args["logprobs"] = 0
        response = await self._client().completions.create(
            model=self.model, prompt=list(prompt_ids), extra_body=extra, **args
        )
        choice = response.choices[0]
        fields = choice.model_extra or {}
        token_ids = fields.get("token_ids")
        if token_ids is None:
            if self.tokenizer is None:
                raise ValueError(
                    f"{self.base_url} did not return token ids; give OpenAIBackend the policy tokenizer to re-encode"
                )
            token_ids = self.tokenizer.encode(choice.text, add_special_tokens=False)
            ended_on_eos = choice.finish_reason == "stop" and fields.get("stop_reason") is None
            if ended_on_eos and self.tokenizer.eos_token_id is not None:
                token_ids.append(self.tokenizer.eos_token_id)
        log_probs = None
        if want_logprobs and choice.logprobs is not None and choice.logprobs.token_logprobs:
            log_probs = [float(x or 0.0) for x in choice.logprobs.token_logprobs][: len(token_ids)]
            log_probs += [0.0] * (len(token_ids) - len(log_probs))
        ended = "length" if choice.finish_reason == "length" else "stop"
        return TokenOutput(
            token_ids=list(token_ids),
            log_probs=log_probs,
            stop_reason=engine_stop_reason(self.engine, ended),
            extra_fields=self._engine_fields(),
        )
