"""Settings of the ``evidence_search`` loop (see docs/rollouts.md for where to set them), its protocol's fixed texts,
and the presets that run an EviPath planner as it was trained."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl_evidence.agent_loops.protocol import PAPER_QUESTION_PROMPT, PLANNER_LAYOUTS
from verl_evidence.prompts import check_placeholders, load_prompt, render_prompt
from verl_evidence.tools.documents import DOCUMENT_FORMATS
from verl_evidence.tools.search_settings import LoopSearchFields

ACTION_STOPS = ["</search>", "</answer>"]
# What wraps an inline observation's document tokens (each piece encoded on its own)
INFORMATION_OPEN = "\n\n<information>"
INFORMATION_CLOSE = "</information>\n\n"
PAPER_ACTION_STOPS = ["</action>", "</answer>"]
OBSERVATION_ROLES = ("inline", "user")
OBSERVATIONS = ("passages", "extract", "executor")
SEARCH_INVALID_ACTION_FEEDBACK = (
    "\nThat was not a valid action. To search, write <search> query </search>. "
    "To finish, write <answer> final answer </answer>.\n"
)
PAPER_INVALID_ACTION_FEEDBACK = (
    '\nThat was not a valid action. To search, write <action> Search("a complete question") </action>. '
    "To finish, write <answer> final answer </answer>.\n"
)

# Settings that run an EviPath SFT'd planner as it was trained (``planner_format`` of the writer).
EVIPATH_SETTINGS: dict[str, dict[str, Any]] = {
    "paper": {
        "action_format": "paper",
        "observation_role": "user",
        "observation": "executor",
        "system_prompt": "evipath_planner",
        "prompt": PAPER_QUESTION_PROMPT,
    },
    "search": {
        "action_format": "search",
        "observation_role": "user",
        "observation": "executor",
        "prompt": "evipath_planner_search",
    },
}


@dataclass(frozen=True)
class SearchLoopSettings(LoopSearchFields):
    """Settings of ``evidence_search`` (see docs/rollouts.md for where to set them); search keys: the base class."""

    max_turns: int = 6
    max_tokens_per_turn: int | None = None
    max_obs_tokens: int = 512
    # None: use the row's chat prompt as is; a prompt name/path: rebuild the user turn from it ({question})
    prompt: str | None = None
    # None: the row's system messages; a prompt name/path: the system message (replacing the row's)
    system_prompt: str | None = None
    # search: <search> q </search>; paper: <action> Search("q") ... </action> (EviPath's planner)
    action_format: str = "search"
    # inline: <information> inside the assistant turn; user: a user chat turn (EviPath's SFT layout)
    observation_role: str = "inline"
    # passages | extract | executor; None: extract if an extractor is set, else passages
    observation: str | None = None
    # How passages are laid out (verl_evidence.tools.documents): ours | search_r1 | auto (the layout of the prompt:
    # `prompt` above, else the one the row was written with, from its extra_info.method)
    document_format: str = "auto"
    invalid_action_feedback: str = SEARCH_INVALID_ACTION_FEEDBACK
    final_turn_notice: str = "\nNo searches are left: give your final answer now inside <answer> and </answer>.\n"
    search_failed_text: str = "The search failed: the search engine is unavailable. Continue with what you know."
    # evidence extractor (EviOmni Algorithm 2): none | policy | openai
    extractor: str = "none"
    extractor_prompt: str = "evidence_extractor"
    extractor_max_tokens: int = 256
    extractor_url: str | None = None
    extractor_model: str | None = None
    extractor_api_key: str = "EMPTY"
    extractor_temperature: float = 0.0
    # EviPath executor (observation: executor); it runs on the extractor's model (policy or endpoint)
    executor_prompt: str = "evipath_executor"
    executor_max_tokens: int = 512

    @property
    def observation_mode(self) -> str:
        if self.observation is not None:
            return self.observation
        return "extract" if self.extractor != "none" else "passages"

    @property
    def observation_model(self) -> str:
        """Who runs the extractor/executor: ``policy`` unless an ``openai`` endpoint is configured."""
        return "policy" if self.extractor == "none" else self.extractor

    @property
    def stops(self) -> list[str]:
        return PAPER_ACTION_STOPS if self.action_format == "paper" else ACTION_STOPS

    @property
    def feedback(self) -> str:
        if self.action_format == "paper" and self.invalid_action_feedback == SEARCH_INVALID_ACTION_FEEDBACK:
            return PAPER_INVALID_ACTION_FEEDBACK
        return self.invalid_action_feedback

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_obs_tokens < 1:
            raise ValueError(f"max_obs_tokens must be >= 1, got {self.max_obs_tokens}")
        if self.extractor not in ("none", "policy", "openai"):
            raise ValueError(f"extractor must be none, policy or openai, got {self.extractor!r}")
        if self.action_format not in PLANNER_LAYOUTS:
            raise ValueError(f"action_format must be one of {PLANNER_LAYOUTS}, got {self.action_format!r}")
        if self.observation_role not in OBSERVATION_ROLES:
            raise ValueError(f"observation_role must be one of {OBSERVATION_ROLES}, got {self.observation_role!r}")
        if self.observation is not None and self.observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {OBSERVATIONS}, got {self.observation!r}")
        if self.document_format not in ("auto", *DOCUMENT_FORMATS):
            raise ValueError(f"document_format must be auto or one of {DOCUMENT_FORMATS}, got {self.document_format!r}")
        if self.observation == "passages" and self.extractor != "none":
            raise ValueError(f"extractor {self.extractor!r} is only used with observation extract or executor")


@dataclass(frozen=True)
class Opening:
    """The messages a trajectory opens with: the row's chat prompt, its system message replaced by the settings'
    ``system_prompt`` and its user turn rebuilt from the settings' ``prompt`` (``{question}``) when they are set."""

    prompt_template: str | None = None
    system_text: str | None = None

    @classmethod
    def from_settings(cls, settings: SearchLoopSettings) -> Opening:
        template = None
        if settings.prompt:
            template = load_prompt(settings.prompt)
            check_placeholders(template, ["question"], name=f"search prompt {settings.prompt!r}")
        system = load_prompt(settings.system_prompt).strip() if settings.system_prompt else None
        return cls(template, system)

    def messages(self, raw_prompt: list[dict], question: str) -> list[dict]:
        messages = [dict(m) for m in raw_prompt]
        if self.system_text is not None:
            messages = [{"role": "system", "content": self.system_text}] + [
                m for m in messages if m.get("role") != "system"
            ]
        if self.prompt_template is None:
            return messages
        # stripped, as the data preparation and EviPath's writer store their rendered prompts
        user = {"role": "user", "content": render_prompt(self.prompt_template.strip(), question=question)}
        kept = [m for m in messages if m.get("role") == "system"]
        return kept + [user]
