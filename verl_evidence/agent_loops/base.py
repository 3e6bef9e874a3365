"""The constructor both of our agent loops share: verl's arguments, then the loop's settings class."""

from __future__ import annotations

from typing import Any, ClassVar

from verl.experimental.agent_loop.agent_loop import AgentLoopBase

from verl_evidence.agent_loops.common import loop_setup


class SettingsAgentLoop(AgentLoopBase):
    """An agent loop configured by a frozen settings dataclass, ``settings_cls``.

    Settings are defaults < ``actor_rollout_ref.rollout.custom.<loop_name>`` < the loop's kwargs (the
    extra keys of its ``agent_loop_config_path`` entry), resolved once per worker config
    (:func:`~verl_evidence.agent_loops.common.loop_setup`); an unknown key fails naming it.
    """

    loop_name: ClassVar[str]
    settings_cls: ClassVar[type]

    def __init__(
        self,
        trainer_config,
        server_manager,
        tokenizer,
        processor,
        dataset_cls,
        data_config,
        tools=None,
        hf_model_type: str | None = None,
        retriever=None,
        **settings: Any,
    ):
        # `tools` is what verl passes every loop (its tool list); our loops search through their own service.
        # `retriever` replaces the HTTP client when a loop is built by hand.
        super().__init__(
            trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, hf_model_type=hf_model_type
        )
        self.settings, self.response_length, self.rollout_name = loop_setup(
            self.config, self.settings_cls, self.loop_name, settings
        )
        self.retriever = retriever
