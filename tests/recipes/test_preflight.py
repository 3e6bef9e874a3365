"""recipes/preflight.py: a reward whose rows, rollout, prompt lengths or devices do not fit stops the run first.

Fast tier: the check itself, in this process, on the recipes' real presets (Hydra composes them with verl's own
config) and small parquet files shaped as the data commands write them. Slow tier: the recipes end to end on rows
from the real data commands (`verl-evidence data qa|grace bundled`); the trainer is a stand-in only in the matching
case (a `python` wrapper that runs the real pre-flight check and reports the trainer command instead of training).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
PRESETS = RECIPES / "presets"
CLI = str(Path(sys.executable).with_name("verl-evidence"))
sys.path.insert(0, str(RECIPES))

import preflight  # noqa: E402

# A node without GPUs that ray.init would not leave: RAY_ADDRESS=local starts a fresh local Ray (other users' Ray
# clusters on this machine would otherwise be joined, and their GPUs are not this check's)
LOCAL_RAY = {"RAY_ADDRESS": "local"}
DECLARED_GPUS = "+ray_kwargs.ray_init.num_gpus=8"  # what Ray is told the node has (the CPU mode does the same)


def qa_row(index: int, evidence: list[str], method: str = "search_r1", **truth) -> dict:
    """A `verl-evidence data qa` row; `evidence: []` is what Search-R1's and FlashRAG's files give."""
    question = f"Which river flows through city number {index}?"
    return {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": f"Answer the question. Question: {question}"}],
        "ability": "fact-reasoning",
        "agent_name": "evidence_search",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Nile"], "evidence": evidence, **truth}},
        "extra_info": {"index": index, "question": question, "method": method, "split": "train"},
    }


def write_rows(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def search_r1_rows(tmp_path_factory) -> Path:
    return write_rows(tmp_path_factory.mktemp("rows") / "nq.parquet", [qa_row(i, []) for i in range(8)])


@pytest.fixture
def local_ray(monkeypatch) -> None:
    for key, value in LOCAL_RAY.items():
        monkeypatch.setenv(key, value)


def problems(config: str, rows: Path, *overrides: str, config_path: Path = PRESETS) -> list[str]:
    return preflight.check(
        [f"--config-path={config_path}", f"--config-name={config}", f"data.train_files={rows}", "data.val_files=null"]
        + list(overrides)
    )


# ---------------------------------------------------------------------------------------------------- fast tier


def test_the_composite_needs_only_what_search_r1_rows_have(search_r1_rows: Path) -> None:
    """evinote + 0.5 x F1 read the gold answers and the search loop's output: Search-R1's rows fit."""
    assert problems("evinote_grpo", search_r1_rows, "reward_preset=composite", DECLARED_GPUS) == []


def test_a_grace_component_refuses_rows_whose_evidence_is_empty(search_r1_rows: Path) -> None:
    """GRACE would read `evidence: []` as "unanswerable" on every row and pay for refusals."""
    components = "++reward.reward_kwargs.components=[{reward:evinote},{reward:grace,weight:0.5}]"
    found = problems("evinote_grpo", search_r1_rows, "reward_preset=composite", components, DECLARED_GPUS)
    assert any(
        f"rows of {search_r1_rows} lack reward_model.ground_truth.answerable (true/false), which the composite's "
        "grace component reads"
        in p
        and "prepare rows with `verl-evidence data grace`" in p
        for p in found
    ), found
    # and the two components parse different rollouts: no rollout preset serves both
    assert any("no rollout serves every part" in p and "grace component parses rollout single_turn" in p for p in found)
    # answerable rows with empty gold evidence: GRACE's evidence ROUGE would have nothing to compare with
    rows = write_rows(search_r1_rows.with_name("flagged.parquet"), [qa_row(0, [], answerable=True)])
    found = problems("grace_dapo", rows, DECLARED_GPUS)
    assert any("lack a non-empty reward_model.ground_truth.evidence on answerable rows" in p for p in found), found


def test_a_command_line_composite_is_checked_by_its_own_components(search_r1_rows: Path) -> None:
    """Not against the built-in composite: Search-R1's exact match beside EviNote at weight 0 fits its rows."""
    components = (
        "++reward.reward_kwargs.components=[{name:search_r1,reward:'verl_evidence.rewards.answer:compute_score'},"
        "{reward:evinote,weight:0.0}]"
    )
    assert problems("evinote_grpo", search_r1_rows, "reward_preset=composite", components, DECLARED_GPUS) == []
    eviomni = "++reward.reward_kwargs.components=[{reward:eviomni,kwargs:{variant:lear}}]"
    found = problems("evinote_grpo", search_r1_rows, "reward_preset=composite", eviomni, DECLARED_GPUS)
    assert any("use rollout_preset=eviomni" in p for p in found), found
    assert any("`verl-evidence data eviomni --method lear`" in p for p in found), found


def test_a_preset_of_ones_own_is_named_and_checked_by_its_reward(tmp_path: Path, search_r1_rows: Path) -> None:
    """A copy under another name (its requires.name still the original's) and a preset without a requires block."""
    presets = tmp_path / "presets"
    shutil.copytree(PRESETS, presets)
    mixed = yaml.safe_load((PRESETS / "reward_preset" / "composite.yaml").read_text())
    mixed["reward_kwargs"]["components"] = [{"reward": "grace", "weight": 1.0}]
    mixed["requires"] = {"name": "composite"}
    (presets / "reward_preset" / "my_mix.yaml").write_text("# @package reward\n" + yaml.safe_dump(mixed))
    found = problems("grace_dapo", search_r1_rows, "reward_preset=my_mix", DECLARED_GPUS, config_path=presets)
    assert found and all(p.startswith("reward preset 'my_mix': ") for p in found), found
    assert any("which the composite's grace component reads" in p for p in found), found

    own = {"reward_manager": {"source": "register", "name": "naive"}}
    own["custom_reward_function"] = {"path": "pkg://my_project.rewards", "name": "compute_score"}
    (presets / "reward_preset" / "mine.yaml").write_text("# @package reward\n" + yaml.safe_dump(own))
    with pytest.raises(preflight.PreflightError) as undescribed:
        problems("search_r1_baseline", search_r1_rows, "reward_preset=mine", DECLARED_GPUS, config_path=presets)
    message = str(undescribed.value)
    assert (
        "no reward preset describes the my_project.rewards reward (naive manager) (function 'pkg://my_project.rewards')"
        in (message)
    )
    assert f"`requires:` block with its rollout, data command and row fields to {presets}/reward_preset/mine.yaml" in (
        message
    )
    assert "PREFLIGHT=0" in message

    own["requires"] = {"rollout": ["search"], "data": "my_prep --out rows.parquet", "row_fields": ["extra_info.doc"]}
    (presets / "reward_preset" / "mine.yaml").write_text("# @package reward\n" + yaml.safe_dump(own))
    found = problems("search_r1_baseline", search_r1_rows, "reward_preset=mine", DECLARED_GPUS, config_path=presets)
    assert found == [
        f"reward preset 'mine': data.train_files: rows of {search_r1_rows} lack extra_info.doc, which the "
        "my_project.rewards reward (naive manager) reads (rows for another method?); prepare rows with "
        "`my_prep --out rows.parquet`"
    ]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from verl_evidence.local.tiny_models import save_tiny_tokenizer

    return save_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def test_rows_that_all_exceed_the_prompt_length_are_refused(tmp_path: Path, tokenizer_dir: Path) -> None:
    """Named with the file and the shortest and longest prompt, counted as verl's overlong filter counts them."""
    from verl_evidence.local.tiny_models import tiny_tokenizer

    long_rows = [qa_row(i, ["x"]) for i in range(3)]
    for i, row in enumerate(long_rows):
        row["prompt"][0]["content"] += " The Nile flows north." * (40 + 10 * i)
    rows = write_rows(tmp_path / "long.parquet", long_rows)
    tokenizer = tiny_tokenizer()
    templated = [
        len(tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"])
        for r in long_rows
    ]
    messages_only = min(len(tokenizer.encode(r["prompt"][0]["content"])) for r in long_rows)
    assert messages_only < min(templated)
    args = [
        "reward_preset=evinote",
        "data.filter_overlong_prompts=true",
        f"actor_rollout_ref.model.path={tokenizer_dir}",
    ]
    found = problems("evinote_grpo", rows, *args, f"data.max_prompt_length={messages_only - 1}", DECLARED_GPUS)
    assert found == [
        f"data.train_files: all 3 prompts of {rows} are longer than data.max_prompt_length={messages_only - 1} "
        f"tokens (shortest {min(templated)}, longest {max(templated)}), so verl's overlong filter would leave no rows; "
        f"raise PROMPT_LEN (data.max_prompt_length) to at least {min(templated)}, or prepare the rows with fewer or "
        "shorter passages"
    ]
    # A prompt whose messages fit is not refused: only the template's own tokens could still push it over
    assert problems("evinote_grpo", rows, *args, f"data.max_prompt_length={messages_only}", DECLARED_GPUS) == []


def test_an_overlong_buffer_as_long_as_the_response_budget_is_refused(tmp_path: Path) -> None:
    """GRACE's preset keeps DAPO's 1024-token buffer; with verl's default 512-token responses every response would
    be penalised."""
    rows = write_rows(tmp_path / "grace.parquet", [qa_row(0, ["The Nile flows."], answerable=True)])
    found = problems("grace_dapo", rows, DECLARED_GPUS, "data.max_response_length=512")
    assert any(
        "overlong_buffer_cfg.len=1024 is not below the response budget max_resp_len=512" in p
        and "start at -512 tokens" in p
        for p in found
    ), found
    assert not any("overlong_buffer_cfg" in p for p in problems("grace_dapo", rows, DECLARED_GPUS))  # the preset: 3072
    found = problems(
        "grace_dapo",
        rows,
        DECLARED_GPUS,
        "data.max_response_length=512",
        "reward.reward_kwargs.overlong_buffer_cfg.len=256",
    )
    assert not any("overlong_buffer_cfg" in p for p in found), found


def test_missing_or_unreadable_data_is_named(tmp_path: Path) -> None:
    missing, text = tmp_path / "nope.parquet", tmp_path / "rows.jsonl"
    text.write_text('{"prompt": "not parquet"}\n')
    (absent,) = problems("evinote_grpo", missing, DECLARED_GPUS)
    assert absent == (
        f"reward preset 'evinote': data.train_files: {missing} does not exist; prepare rows with "
        "`verl-evidence data qa --method evinote`"
    )
    (unreadable,) = problems("evinote_grpo", text, DECLARED_GPUS)
    assert f"data.train_files: cannot read {text} as parquet (" in unreadable


def test_a_gpu_run_on_a_node_without_gpus_is_refused_unless_it_joins_a_cluster(
    search_r1_rows: Path, local_ray, monkeypatch
) -> None:
    (found,) = problems("evinote_grpo", search_r1_rows, "reward_preset=composite")
    assert found.startswith("this run asks Ray for 8 GPU(s) (trainer.nnodes=1 x trainer.n_gpus_per_node=8) and ")
    assert "verl would wait for them forever; on a machine without GPUs add --smoke to the recipe" in found
    assert problems("evinote_grpo", search_r1_rows, "reward_preset=composite", DECLARED_GPUS) == []
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # a Slurm job's cluster: its GPUs are the cluster's
    assert problems("evinote_grpo", search_r1_rows, "reward_preset=composite") == []


def test_every_refusal_is_one_line_and_exits_2(search_r1_rows: Path, local_ray, monkeypatch, capsys) -> None:
    argv = [f"--config-path={PRESETS}", "--config-name=grace_dapo", f"data.train_files={search_r1_rows}"]
    monkeypatch.setattr(sys, "argv", ["preflight.py", *argv, "data.val_files=null"])
    with pytest.raises(SystemExit) as exited:
        preflight.main()
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    # the GPUs; the rows' missing answerability and their agent loop
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines), lines
    assert all(line.endswith("; nothing was started") for line in lines)
    assert sum(str(search_r1_rows) in line for line in lines) == 2


def test_the_needs_table_is_the_one_the_docs_show() -> None:
    """docs/reward-managers.md's table row by row, and every built-in preset scored by functions it describes."""
    page = (REPO / "docs" / "reward-managers.md").read_text()
    shown = {
        match[0]: [cell.strip() for cell in match[1:]]
        for match in re.findall(r"^\| `(verl_evidence\.rewards\.\w+)` \|([^|]*)\|([^|]*)\|([^|]*)\|$", page, re.M)
    }
    assert set(shown) == set(preflight.REWARD_NEEDS)
    for module, need in preflight.REWARD_NEEDS.items():
        rollouts, data, fields = shown[module]
        assert rollouts == (" or ".join(f"`{r}`" for r in need.rollouts) or "any"), module
        assert data == f"`{need.data}`", module
        wanted = [preflight.CONDITIONS[f.condition][1].format(path=f"`{f.path}`") for f in need.fields]
        assert fields == ", ".join(wanted), module
    for path in sorted((PRESETS / "reward_preset").glob("*.yaml")):
        preset = yaml.safe_load(path.read_text())
        assert "requires" not in preset, f"{path.name}: the table describes the built-in rewards"
        manager = preset["reward_manager"]["name"]
        functions = [(preset.get("custom_reward_function") or {}).get("path")]
        if manager == "composite":
            functions = [c["reward"] for c in preset["reward_kwargs"]["components"]]
        elif manager in preflight.MANAGER_REWARDS:
            functions = [manager]
        for function in functions:
            module = function if "." in function else f"verl_evidence.rewards.{function}"
            assert preflight.function_module(module) in preflight.REWARD_NEEDS, (path.name, function)


def test_the_recipes_composite_is_the_evaluations() -> None:
    """One "composite": the preset's components and weights are the ones eval and the demo score with."""
    from verl_evidence.eval.session import COMPOSITE_COMPONENTS

    preset = yaml.safe_load((PRESETS / "reward_preset" / "composite.yaml").read_text())

    def normalized(components: list[dict]) -> list[tuple]:
        return [(c["reward"], float(c.get("weight", 1.0)), c.get("name"), c.get("kwargs") or {}) for c in components]

    assert normalized(preset["reward_kwargs"]["components"]) == normalized(COMPOSITE_COMPONENTS)
    assert normalized(COMPOSITE_COMPONENTS) == [
        ("evinote", 1.0, None, {}),
        ("verl_evidence.rewards.answer:answer_f1", 0.5, "answer_f1", {}),
    ]


# ---------------------------------------------------------------------------------------------------- slow tier


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, Path]:
    """One parquet file per data command, from the bundled questions."""
    out = tmp_path_factory.mktemp("rows")
    commands = {
        "qa": [CLI, "data", "qa", "bundled", "--method", "evinote", "-o", str(out / "qa.parquet")],
        "grace": [CLI, "data", "grace", "bundled", "--retriever", "bm25", "-o", str(out / "grace.parquet")],
    }
    for command in commands.values():
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 0, result.stderr[-2000:]
    return {name: out / f"{name}.parquet" for name in commands}


def stand_in_python(tmp_path: Path) -> Path:
    """Runs everything with the real interpreter except the trainer, whose command line it prints."""
    python = tmp_path / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1 $2" = "-m verl.trainer.main_ppo" ]; then echo "TRAINER STARTED"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return python


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_recipe(script: str, python: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RETRIEVAL_URL", "SERVER_ARGS", "ALLOW_DEMO_CORPUS")}
    return subprocess.run(
        ["bash", str(RECIPES / script), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**base, "PYTHON": str(python), **LOCAL_RAY, **env},
    )


@pytest.mark.slow  # the data commands and the Hydra composition in subprocesses
def test_grace_on_search_rows_stops_before_anything_starts(rows, tmp_path: Path) -> None:
    """evinote_grpo.sh reward_preset=grace on `data qa` rows: GRACE would call every question unanswerable."""
    port = free_port()  # a local URL with no server: the recipe would start one, but only after the check
    result = run_recipe(
        "evinote_grpo.sh",
        stand_in_python(tmp_path),
        "reward_preset=grace",
        DECLARED_GPUS,
        TRAIN_FILES=str(rows["qa"]),
        VAL_FILES=str(rows["qa"]),
        RETRIEVAL_URL=f"http://127.0.0.1:{port}",
        SERVER_ARGS=f"--index-dir {tmp_path / 'index'}",
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: reward preset 'grace': " in result.stderr
    assert "use rollout_preset=single_turn" in result.stderr
    assert f"rows of {rows['qa']} lack reward_model.ground_truth.answerable" in result.stderr
    assert "`verl-evidence data grace`" in result.stderr
    assert "TRAINER STARTED" not in result.stdout
    with pytest.raises(OSError):  # and no retrieval server was started for it
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.mark.slow  # the data commands and the Hydra composition in subprocesses
def test_search_rows_under_the_grace_recipe_name_their_loop(rows, tmp_path: Path) -> None:
    """The rows' agent_name column wins over the rollout preset in verl: rows for a search loop are caught too."""
    result = run_recipe(
        "grace_dapo.sh", stand_in_python(tmp_path), DECLARED_GPUS, TRAIN_FILES=str(rows["qa"]), VAL_FILES="null"
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "name agent loop 'evidence_search' in their agent_name column" in result.stderr
    assert "TRAINER STARTED" not in result.stdout


@pytest.mark.slow  # the data commands and the Hydra composition in subprocesses
@pytest.mark.parametrize(
    ("script", "data", "args"),
    [
        ("grace_dapo.sh", "grace", []),
        ("grace_dapo.sh", "grace", ["reward_preset=grace"]),
        ("evinote_grpo.sh", "grace", ["reward_preset=grace", "rollout_preset=single_turn"]),
        ("evinote_grpo.sh", "qa", ["reward_preset=composite"]),
        ("search_r1_baseline.sh", "qa", []),
    ],
)
def test_matching_reward_rollout_and_rows_start_the_trainer(rows, tmp_path: Path, script, data, args) -> None:
    result = run_recipe(
        script,
        stand_in_python(tmp_path),
        "--no-server",
        DECLARED_GPUS,
        *args,
        TRAIN_FILES=str(rows[data]),
        VAL_FILES=str(rows[data]),
        RETRIEVAL_URL="http://127.0.0.1:9",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "# pre-flight: reward, rollout, data and devices fit" in result.stderr
    assert "TRAINER STARTED" in result.stdout


@pytest.mark.slow  # the Hydra composition in a subprocess
def test_a_gpu_recipe_on_this_cpu_machine_says_so_instead_of_hanging(rows, tmp_path: Path) -> None:
    result = run_recipe("grace_dapo.sh", stand_in_python(tmp_path), TRAIN_FILES=str(rows["grace"]), VAL_FILES="null")
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "this node has 0, so verl would wait for them forever" in line and "add --smoke" in line
    assert "TRAINER STARTED" not in result.stdout


def test_transfer_queue_still_names_its_controller_as_the_check_looks_for_it() -> None:
    """The check finds a running trainer by its TransferQueue controller's name: fails when verl's TransferQueue
    renames it (then a second trainer on a cluster would pass the check unseen)."""
    import inspect

    import transfer_queue.interface as tq

    source = inspect.getsource(tq.init) + inspect.getsource(tq._init_from_existing)
    named = preflight.TRANSFER_QUEUE_CONTROLLER
    assert f'name="{named["name"]}", namespace="{named["namespace"]}"' in source
    assert f'ray.get_actor("{named["name"]}", namespace="{named["namespace"]}")' in source


@pytest.mark.slow  # the session's Ray cluster, and one actor process
def test_a_run_joining_a_cluster_where_a_trainer_runs_is_refused(search_r1_rows: Path, ray_cluster, monkeypatch):
    import ray
    from transfer_queue.controller import TransferQueueController

    address = ray.get_runtime_context().gcs_address
    monkeypatch.setenv("RAY_ADDRESS", address)  # the trainer would join the session's cluster, as a Slurm job's run
    command = ("evinote_grpo", search_r1_rows, "reward_preset=composite")
    assert problems(*command) == []  # nobody trains there yet
    # what verl's trainer starts on its cluster (transfer_queue.init): the real controller, by its name
    controller = TransferQueueController.options(**preflight.TRANSFER_QUEUE_CONTROLLER, num_cpus=0).remote()
    try:
        ray.get(controller.__ray_ready__.remote(), timeout=120)
        (found,) = problems(*command)
        assert found.startswith(f"the Ray cluster at {address} already runs a verl trainer")
        assert "run this one on a cluster of its own (another Slurm job) or after the first ends" in found
    finally:
        ray.kill(controller)
    deadline = time.monotonic() + 30
    while problems(*command) and time.monotonic() < deadline:  # the name is free once the actor is gone
        time.sleep(0.5)
    assert problems(*command) == []
    # a process Ray's token authentication refuses: the check says it did not run, and the run goes on to ray.init
    probe = f"import sys; sys.path.insert(0, {str(RECIPES)!r}); import preflight; "
    probe += f"print(preflight.running_trainer_problem({address!r}))"
    refused = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN_PATH": "/nonexistent"}
        | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},  # the session's cluster is on loopback only (join_local_ray)
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 0 and refused.stdout.strip() == "None", refused.stderr[-2000:]
    assert f"# pre-flight: no trainer check on the Ray cluster at {address}: cannot connect" in refused.stderr


def test_a_cluster_address_nobody_listens_at_is_left_to_rays_own_error(monkeypatch, capsys) -> None:
    import ray

    def no_init(*args, **kwargs):  # ray.init retries such an address for a minute before it fails
        raise AssertionError("ray.init called for an address nobody listens at")

    monkeypatch.setattr(ray, "init", no_init)
    with socket.socket() as probe:  # a port just freed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert preflight.running_trainer_problem(f"127.0.0.1:{port}") is None
    # not a silent skip: the user reads that the check did not run, and why
    assert f"# pre-flight: no trainer check on the Ray cluster at 127.0.0.1:{port}: nothing answers there" in (
        capsys.readouterr().err
    )
