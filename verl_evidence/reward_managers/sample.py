"""One trajectory of a verl ``DataProto``, decoded into what the reward cores need."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl import DataProto

logger = logging.getLogger(__name__)


@dataclass
class Sample:
    """Inputs of a ``compute_score(data_source, solution_str, ground_truth, extra_info)`` call.

    ``extra_info`` is a private copy of the dataset's ``extra_info`` with the
    rollout's ``tool_extra_fields`` merged over it (the dataset dict is shared by
    the ``n`` rollouts of a prompt, so it is never mutated).
    """

    data_source: Any
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any]
    tool_extra_fields: dict[str, Any] = field(default_factory=dict)
    raw_prompt: Any = None
    prompts: Any = None  # padded prompt ids and their attention mask, decoded only if the question is needed
    prompt_mask: Any = None
    tokenizer: Any = None

    def question(self) -> str:
        """The question: rollout field, dataset field, last user message, or the decoded prompt."""
        for source in (self.tool_extra_fields, self.extra_info):
            value = source.get("question")
            if isinstance(value, str) and value.strip():
                return value
        messages = self.raw_prompt
        if hasattr(messages, "tolist"):
            messages = messages.tolist()
        if isinstance(messages, (list, tuple)):
            for message in reversed(messages):
                if isinstance(message, Mapping) and message.get("role") == "user":
                    return str(message.get("content", ""))
        if self.prompts is not None and self.tokenizer is not None:
            return self.tokenizer.decode(self.prompts[self.prompt_mask.bool()], skip_special_tokens=True)
        return ""


def _as_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    logger.warning("ignoring non-dict reward input of type %s", type(value).__name__)
    return {}


async def decode_sample(data: DataProto, tokenizer: Any) -> Sample:
    """Decode the (last) trajectory of ``data`` as verl's naive manager does.

    The response is cut at the attention mask and decoded without special
    tokens; decoding runs in the default executor (it is CPU work).
    """
    item = data[-1:][0]  # multi-output trajectories are scored on their last output, like verl's managers
    responses = item.batch["responses"]
    response_length = responses.shape[-1]
    attention_mask = item.batch["attention_mask"]
    valid_length = int(attention_mask[-response_length:].sum())
    response_ids = responses[:valid_length]
    prompts = item.batch["prompts"]

    non_tensor = item.non_tensor_batch
    reward_model = _as_dict(non_tensor.get("reward_model"))
    tool_extra_fields = _as_dict(non_tensor.get("tool_extra_fields"))
    extra_info = _as_dict(non_tensor.get("extra_info"))
    extra_info.update(tool_extra_fields)
    num_turns = non_tensor.get("__num_turns__")
    if num_turns is not None:
        extra_info["num_turns"] = int(num_turns)

    loop = asyncio.get_running_loop()

    response_text = await loop.run_in_executor(None, lambda: tokenizer.decode(response_ids, skip_special_tokens=True))
    return Sample(
        data_source=non_tensor.get("data_source"),
        solution_str=response_text,
        ground_truth=reward_model.get("ground_truth"),
        extra_info=extra_info,
        tool_extra_fields=tool_extra_fields,
        raw_prompt=non_tensor.get("raw_prompt"),
        prompts=prompts,
        prompt_mask=attention_mask[: prompts.shape[-1]],
        tokenizer=tokenizer,
    )
