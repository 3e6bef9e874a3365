"""Write docs/configuration.md from the code, so the reference cannot drift.

Names, types and defaults are read from the dataclasses, pydantic models and
typer commands themselves; only the one-line meanings of dataclass fields that
carry no description in the code live here (in ``MEANINGS``). A field without a
meaning, or a meaning for a field that no longer exists, is an error, so adding
a setting means documenting it.

    python docs/gen_config_reference.py           # rewrite docs/configuration.md
    python docs/gen_config_reference.py --check   # exit 1 if the page is out of date

``tests/docs/test_config_reference.py`` runs the check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import sys
import typing
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent / "configuration.md"

# Meanings of fields whose code carries none, keyed by "<section>.<field>".
MEANINGS: dict[str, str] = {
    # verl_evidence.rewards.eviomni.EviOmniConfig
    "eviomni.l1": "weight of the answer reward (mean F1 of o_r, o_e, o_f)",
    "eviomni.l2": "weight of the length reward",
    "eviomni.l3": "weight of the format reward",
    "eviomni.omega": "evidence-compression threshold: `len_e_reward = 1` when `1 - L_e/L_P >= omega`",
    "eviomni.tau": "temperature of the rationale-length sigmoid (> 0)",
    "eviomni.gamma": "exponent of the evidence-length reward below `omega` (>= 0)",
    "eviomni.answer_rewards": "which of o_r, o_e, o_f R^ans averages (`rationale`, `evidence`, `full`; Table 4)",
    # verl_evidence.rewards.evinote.EviNoteConfig
    "evinote.markers": 'SEN annotation markers (key, uncertain); the released code used `["*", "#"]`',
    "evinote.claim_template": "NLI hypothesis; only `{answer}` (first gold answer) and `{question}`",
    "evinote.correct_reward": "gate value for a well-formatted, exact-match answer",
    "evinote.note_reward": "gate value for a wrong answer with well-formed notes",
    "evinote.note_tag": "the notes' tag: `summary`, or `evidence` (the Naive Evidence ablation)",
    "evinote.note_policy": "notes required: `at_least_one` (method), `optional` (NS, NE), `after_each_retrieval` (FS)",
    "evinote.annotations": "a wrong answer needs annotated notes for `note_reward` (false: well-formed tags suffice)",
    "evinote.eqr": "add EQR (false: the ablations without the judge; no NLI model is started)",
    "evinote.stochastic_reward": "FS+SR: added to a well-formed wrong answer with `stochastic_probability`",
    "evinote.stochastic_probability": "FS+SR: chance of `stochastic_reward` (the paper's 1/3)",
    "evinote.stochastic_seed": "FS+SR: seed of the coin, hashed with the question and the response",
    # verl_evidence.rewards.grace.GraceConfig
    "grace.format_reward": "paid for a valid structure",
    "grace.path_reward": "paid for the right path (`<evidence>` iff answerable)",
    "grace.alpha": "weight of ROUGE-L(evidence, gold evidence)",
    "grace.beta": "weight of ROUGE-L(answer, gold answers)",
    "grace.evidence_reference": "multi-hop gold evidence: `joined` (one reference, as released) or `per_sentence`",
    # verl_evidence.agent_loops.search_loop_settings.SearchLoopSettings
    "search_loop.max_turns": "generations per trajectory; the last one may only answer",
    "search_loop.max_tokens_per_turn": "cap per generation (null: what is left of `rollout.response_length`)",
    "search_loop.max_obs_tokens": "tokens of one `<information>` body, truncated at the end",
    "search_loop.prompt": "null: the row's chat prompt as is; a prompt name/file: user turn rebuilt from `{question}`",
    "search_loop.system_prompt": (
        "null: the row's system messages; a prompt name/file: the system message (replaces the row's)"
    ),
    "search_loop.action_format": (
        '`search`: `<search> q </search>`; `paper`: `<action> Search("q") </action>` (EviPath planner)'
    ),
    "search_loop.observation_role": (
        "`inline`: `<information>` inside the assistant turn; `user`: a user chat turn (EviPath SFT layout)"
    ),
    "search_loop.observation": (
        "`passages`, `extract` or `executor` (EviPath executor); null: `extract` with an extractor, else `passages`"
    ),
    "search_loop.document_format": (
        "passage layout: `ours`, `search_r1` (Search-R1's), `auto`: the prompt's (the row's `extra_info.method`)"
    ),
    "search_loop.executor_prompt": "EviPath executor prompt (`observation: executor`); runs on the extractor's model",
    "search_loop.executor_max_tokens": "executor generation length",
    "search_loop.invalid_action_feedback": "appended (mask 0) after a turn without a valid action",
    "search_loop.final_turn_notice": 'appended before the last turn (`""` disables)',
    "search_loop.search_failed_text": "`<information>` body when retrieval fails",
    "search_loop.extractor": "evidence extractor: `none`, `policy` (same engine) or `openai` (endpoint)",
    "search_loop.extractor_prompt": "extractor prompt, `{question} {thought} {query} {passages}`",
    "search_loop.extractor_max_tokens": "extractor generation length",
    "search_loop.extractor_url": "OpenAI-compatible endpoint for `extractor: openai`",
    "search_loop.extractor_model": "model name at `extractor_url`",
    "search_loop.extractor_api_key": "API key for `extractor_url`",
    "search_loop.extractor_temperature": "extractor sampling temperature",
    # verl_evidence.agent_loops.eviomni_loop.EviOmniLoopSettings
    "eviomni_loop.prompt": "policy prompt, `{question} {passages}`",
    "eviomni_loop.answer_prompt": "masked-answer prompt, `{question} {passages} {rationale} {evidence}`",
    "eviomni_loop.placeholder": "text that replaces the masked parts",
    "eviomni_loop.topk": "passages fetched from the server (only for rows without `extra_info.passages`)",
    "eviomni_loop.masked_answer_max_tokens": "length of o_r and o_e",
    "eviomni_loop.masked_answer_temperature": "null: the rollout's sampling params; a number overrides",
    # verl_evidence.tools.search_tool.SearchTool (tool YAML `config`)
    "search_tool.max_queries": "queries per call; more is answered with an error text",
    "search_tool.document_format": "passage layout: `ours` or `search_r1` (Search-R1's; docs/rollouts.md)",
    # retrieval_server.config.ServerConfig fields without a description
    "server.index_dir": "index directory written by `index build`",
    "server.corpus": "must be the corpus the manifest recorded (null: the recorded one)",
    "server.batch_wait_timeout_s": "how long a batch waits to fill",
    "server.route_prefix": "Serve route prefix",
    "server.app_name": "Serve application name",
    "server.token": "require `Authorization: Bearer <token>` on every route but `/healthz`",
    # typer options without a help text
    "build.query-prefix": "prepended to queries (default: by model family, e.g. E5 `query: `)",
    "build.passage-prefix": "prepended to passages (default: by model family, e.g. E5 `passage: `)",
    "build.max-length": "encoder token limit (with `--model`; the packaged MiniLM uses 256)",
    "build.device": "encoder device (default: GPU if visible)",
    "adopt.device": "device of the verification encoder (default: GPU if visible)",
}

_used: set[str] = set()


def meaning(section: str, name: str, code_description: str | None = None) -> str:
    key = f"{section}.{name}"
    if code_description:  # the code's own description wins
        _used.add(key)
        return code_description
    if key not in MEANINGS:
        raise SystemExit(f"{key}: new setting without a meaning; add it to MEANINGS in {Path(__file__).name}")
    _used.add(key)
    return MEANINGS[key]


def value(default: Any) -> str:
    """A default as it would be written in YAML."""
    if default is None:
        text = "null"
    elif isinstance(default, bool):
        text = str(default).lower()
    elif isinstance(default, str):
        shown = default if len(default) <= 48 else default[:45] + "…"
        text = (
            '"' + shown.replace("\n", "\\n") + '"'
            if (shown != shown.strip() or not shown or "\n" in shown or len(default) > 48)
            else shown
        )
    elif isinstance(default, (tuple, list)):
        text = json.dumps(list(default))
    elif isinstance(default, Path):
        text = str(default)
    else:
        text = repr(default)
    return f"`{text}`"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(str(arg) for arg in typing.get_args(annotation))
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return text.replace("typing.", "").replace("Optional", "").replace("pathlib.", "")


def dataclass_rows(cls: type, section: str, prefix: str = "") -> list[tuple[str, ...]]:
    rows = []
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            default = value(field.default)
        elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = value(field.default_factory())  # type: ignore[misc]
        else:
            default = "required"
        description = field.metadata.get("description")  # the search keys: SearchSettings' own descriptions
        rows.append(
            (f"`{prefix}{field.name}`", type_name(field.type), default, meaning(section, field.name, description))
        )
    return rows


def pydantic_rows(model: type, section: str, prefix: str = "") -> list[tuple[str, ...]]:
    rows = []
    for name, field in model.model_fields.items():
        default = "required" if field.is_required() else value(field.get_default(call_default_factory=True))
        rows.append(
            (f"`{prefix}{name}`", type_name(field.annotation), default, meaning(section, name, field.description))
        )
    return rows


def typer_rows(app: Any, path: list[str], section: str) -> list[tuple[str, ...]]:
    import click
    import typer.main

    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    rows = []
    for param in command.params:
        if param.name == "help":
            continue
        names = ", ".join(f"`{opt}`" for opt in [*param.opts, *getattr(param, "secondary_opts", [])])
        if isinstance(param, click.Argument):
            names = f"`{param.name.upper()}` (argument)"
        if param.required:
            default = "required"
        elif isinstance(param.default, bool) and getattr(param, "secondary_opts", None):
            default = f"`{param.opts[0] if param.default else param.secondary_opts[0]}`"
        else:
            default = value(param.default)
        help_text = meaning(section, param.opts[0].lstrip("-"), getattr(param, "help", None))
        if getattr(param, "envvar", None):
            help_text = f"{help_text} (env `{param.envvar}`)".strip()
        rows.append((names, default, help_text))
    return rows


def render() -> str:
    _used.clear()
    from retrieval_server import cli as server_cli
    from retrieval_server.config import BuildConfig, ServerConfig
    from verl_evidence.agent_loops.eviomni_loop import EviOmniLoopSettings
    from verl_evidence.agent_loops.search_loop_settings import SearchLoopSettings
    from verl_evidence.reward_managers import MANAGER_NAMES, scorers
    from verl_evidence.reward_managers.judge import JudgeConfig
    from verl_evidence.rewards import evinote, eviomni, grace
    from verl_evidence.tools.search_settings import RETRIEVAL_URL_ENV
    from verl_evidence.tools.search_tool import SearchTool
    from verl_evidence.trainer import advantage

    header = ("key", "type", "default", "meaning")
    out: list[str] = []
    add = out.append

    add("# Configuration reference\n")
    add(
        "<!-- GENERATED by docs/gen_config_reference.py from the code; do not edit by hand.\n"
        "     Regenerate: python docs/gen_config_reference.py (tests/docs checks it is current). -->\n"
    )
    add(
        "Every setting of the reward managers, the advantage estimator, the agent loops, the "
        "`search` tool and the retrieval server, with its default as the code has it. How the "
        "pieces fit: [architecture](architecture.md); what the rewards compute: "
        "[reward managers](reward-managers.md) and the method pages.\n"
    )

    # ---- reward managers
    add("## Reward managers (`reward.reward_kwargs`)\n")
    add(
        "Select with `reward.reward_manager.source=register reward.reward_manager.name=<name>`, "
        f"name one of {', '.join(f'`{n}`' for n in MANAGER_NAMES)}. "
        "`reward_kwargs` is not in verl's `ppo_trainer.yaml`, "
        "so on the command line every key needs `+` (`+reward.reward_kwargs.tau=0.2`), or `++` "
        "when a preset already sets it. Bad values fail when the reward workers start.\n"
    )
    add("### `eviomni` (EviOmni / LEAR)\n")
    rows = [("`variant`", "str", "`eviomni`", f"`{'` or `'.join(eviomni.VARIANTS)}` (same defaults; names the paper)")]
    rows += dataclass_rows(eviomni.EviOmniConfig, "eviomni")
    add(table(header, rows) + "\n")
    add(f"Logged keys: {', '.join(f'`{k}`' for k in eviomni.RESULT_KEYS)}, `{scorers.ERROR_KEY}`.\n")

    add("### `evinote` (EviNote-RAG)\n")
    rows = dataclass_rows(evinote.EviNoteConfig, "evinote")
    add(table(header, rows) + "\n")
    add(
        f"Plus the NLI judge keys (prefix `{JudgeConfig.PREFIX}`, below). Logged keys: "
        f"{', '.join(f'`{k}`' for k in evinote.RESULT_KEYS)}, `{scorers.ERROR_KEY}`.\n"
    )

    add("### `grace` (GRACE)\n")
    train, validation = grace.GRACE_TRAIN, grace.GRACE_VALIDATION
    rows = [
        (
            "`mode`",
            "str",
            value(None),
            (
                "`train` or `validation` forces one mode for every sample; null: the trainer's phase "
                "(`extra_info.trainer_phase`, written by `PhaseAgentLoopManager`; docs/methods/grace.md)"
            ),
        ),
        (
            "`validation_splits`",
            "list[str]",
            value(scorers.DEFAULT_VALIDATION_SPLITS),
            "without the phase manager: splits scored with the validation defaults (unless `extra_info.validate`)",
        ),
    ]
    for field in dataclasses.fields(grace.GraceConfig):
        train_value, val_value = getattr(train, field.name), getattr(validation, field.name)
        shown = (
            value(train_value) if train_value == val_value else f"{value(train_value)} (validation {value(val_value)})"
        )
        rows.append((f"`{field.name}`", type_name(field.type), shown, meaning("grace", field.name)))
    add(table(header, rows) + "\n")
    add(f"Logged keys: {', '.join(f'`{k}`' for k in grace.RESULT_KEYS)}, `{scorers.ERROR_KEY}`.\n")

    add("### `composite`\n")
    fields = sorted(scorers._COMPONENT_FIELDS)
    add(
        "`components`: a list of mappings with the fields "
        f"{', '.join(f'`{f}`' for f in fields)}. `reward` is one of "
        f"{', '.join(f'`{r}`' for r in scorers.BUILTIN_REWARDS)}, `custom` (verl's "
        "`reward.custom_reward_function`) or an importable `module:function` / `pkg://module:function` / "
        "`/path/file.py:function`; `weight` defaults to 1; `kwargs` go to that component; `name` is the "
        "log prefix; `keys` lists extra result keys of a function to log. `nli_*` keys at the top level "
        "configure the judge of `evinote` components. Example in [reward-managers.md](reward-managers.md#composite).\n"
    )

    add("### NLI judge (`nli_*`, for `evinote` and `composite`)\n")
    add(table(header, pydantic_rows(JudgeConfig, "judge", JudgeConfig.PREFIX)) + "\n")

    # ---- estimator
    add("## Advantage estimator\n")
    add(
        table(
            ("key", "default", "meaning"),
            [
                (
                    "`algorithm.adv_estimator`",
                    "",
                    f"`{advantage.ESTIMATOR_NAME}`: GRPO with the group std floored at `eps_std`",
                ),
                ("`+algorithm.eps_std`", value(advantage.DEFAULT_EPS_STD), "std floor, must be > 0"),
            ],
        )
        + "\n"
    )

    # ---- agent loops
    add("## Agent loops\n")
    add(
        "Set per loop under `actor_rollout_ref.rollout.custom.<loop>.<key>` (command line: "
        "`+actor_rollout_ref.rollout.custom.evidence_search.max_turns=4`) or as extra keys of the loop's "
        "entry in `actor_rollout_ref.rollout.agent.agent_loop_config_path` (wins). Unknown keys fail at "
        "the first rollout. Details: [rollouts](rollouts.md).\n"
    )
    add("### `evidence_search` (`SearchLoopSettings`)\n")
    add(table(header, dataclass_rows(SearchLoopSettings, "search_loop")) + "\n")
    add("### `eviomni` (`EviOmniLoopSettings`)\n")
    add(table(header, dataclass_rows(EviOmniLoopSettings, "eviomni_loop")) + "\n")

    # ---- search tool: defaults read from a constructed tool (no server is contacted)
    add("## `search` tool (verl `ToolAgentLoop`)\n")
    with contextlib.redirect_stdout(io.StringIO()):  # verl's BaseTool prints its schema
        tool = SearchTool({"retrieval_url": "http://unused"})
    service = tool.service.settings
    from verl_evidence.tools.search_settings import TOOL_FIELDS, SearchSettings

    # the tool's own keys, then the search settings it takes (their environment fallbacks shown as null)
    tool_rows = [
        ("max_queries", tool.max_queries, meaning("search_tool", "max_queries")),
        ("document_format", tool.document_format, meaning("search_tool", "document_format")),
    ]
    for name in TOOL_FIELDS:
        default = None if name in ("retrieval_url", "token", "wait_for_server_s") else getattr(service, name)
        tool_rows.append((name, default, SearchSettings.model_fields[name].description))
    add(
        "The `config` mapping of the tool's entry in the tool YAML (`class_name: "
        "verl_evidence.tools.search_tool.SearchTool`); a ready file is "
        "`verl_evidence/configs/search_tool.yaml`. The URL falls back to the env variable "
        f"`{RETRIEVAL_URL_ENV}`.\n"
    )
    add(
        table(
            ("key", "default", "meaning"),
            [(f"`{k}`", value(v), text) for k, v, text in tool_rows],
        )
        + "\n"
    )

    # ---- retrieval server
    add("## Retrieval server\n")
    add("### `verl-evidence serve` / `retrieval-server serve`\n")
    add(table(("option", "default", "meaning"), typer_rows(server_cli.app, ["serve"], "serve")) + "\n")
    add("### `verl-evidence index build` / `retrieval-server build`\n")
    add(table(("option", "default", "meaning"), typer_rows(server_cli.app, ["build"], "build")) + "\n")
    add("### `verl-evidence index recall` / `retrieval-server recall`\n")
    add(table(("option", "default", "meaning"), typer_rows(server_cli.app, ["recall"], "recall")) + "\n")
    add("### `verl-evidence index adopt` / `retrieval-server adopt`\n")
    add(table(("option", "default", "meaning"), typer_rows(server_cli.app, ["adopt"], "adopt")) + "\n")
    add("### `verl-evidence index convert` / `retrieval-server convert`\n")
    add(table(("option", "default", "meaning"), typer_rows(server_cli.app, ["convert"], "convert")) + "\n")
    add("### `verl-evidence index verify` / `retrieval-server verify`\n")
    add(table(("option", "default", "meaning"), typer_rows(server_cli.app, ["verify"], "verify")) + "\n")
    add("### `ServerConfig` (Python, `serve run retrieval_server.launch:app_builder key=value ...`)\n")
    add(
        "The fields `start_server(config)` and Ray's `serve run`/`serve deploy` builder take; the CLI "
        "options above map onto them (`--replicas` → `num_replicas`, `--batch-wait-ms` → "
        "`batch_wait_timeout_s` / 1000, ...).\n"
    )
    add(table(header, pydantic_rows(ServerConfig, "server")) + "\n")
    add(
        f"`BuildConfig` adds `train_sample` (default `{BuildConfig.model_fields['train_sample'].default}`): "
        "vectors used to train IVF/PQ indexes (`index build --train-sample`).\n"
    )

    # ---- environment
    add("## Environment variables\n")
    add(
        table(
            ("variable", "read by", "meaning"),
            [
                (
                    f"`{RETRIEVAL_URL_ENV}`",
                    "search loop, `search` tool",
                    "retrieval server URL when the config gives none",
                ),
                ("`VERL_EVIDENCE_RETRIEVAL_TOKEN`", "search loop, `search` tool", "bearer token sent to the server"),
                (
                    "`VERL_EVIDENCE_RETRIEVAL_WAIT_S`",
                    "search loops, `search` tool",
                    "seconds to wait for the server's `/health` before the first search; the searching recipes set "
                    "it (to `SERVER_WAIT`) when they start their own server beside the trainer",
                ),
                ("`RETRIEVAL_SERVER_TOKEN`", "`serve`", "the bearer token (not on the command line, unlike `--token`)"),
                (
                    "`VERL_EVIDENCE_CACHE`",
                    "`serve`, `index`, demo, `--smoke`",
                    "the project's cache directory (default `~/.cache/verl-evidence`): indexes, encoder exports, the "
                    "smoke policies and data (`smoke/`, unless `VERL_EVIDENCE_SMOKE_DIR` is set)",
                ),
                (
                    "`VERL_EVIDENCE_TINY_TOKENIZER`",
                    "`--smoke`, tests' tiny models",
                    "unset: the tiny policy's nearly byte-level tokenizer; `N`: a BPE of N entries trained on the "
                    "smoke texts, cached apart (the learning benchmark's 4000: prompts 2.2–2.3× fewer tokens)",
                ),
                (
                    "`VERL_USE_EXTERNAL_MODULES`",
                    "verl",
                    "`verl_evidence.plugin` registers the plugin without its entry point",
                ),
                (
                    "`VERL_USE_EXTERNAL_PLUGINS`",
                    "verl",
                    "`none` disables entry-point plugins; a comma list loads only those",
                ),
            ],
        )
        + "\n"
    )

    stale = sorted(set(MEANINGS) - _used)
    if stale:
        raise SystemExit(f"MEANINGS has entries for settings that no longer exist: {stale}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
