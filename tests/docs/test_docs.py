"""The docs' code is real: CLI examples parse against the CLI, YAML parses, Python runs, links resolve.

Python blocks run unless the line right before their fence is ``<!-- not-run -->``
(used for fragments that need a GPU, a model directory or surrounding code).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = sorted(
    [ROOT / "README.md", ROOT / "recipes" / "README.md", *(ROOT / "docs").rglob("*.md")],
    key=lambda p: str(p),
)
NOT_RUN = "<!-- not-run -->"
CLI_NAMES = ("verl-evidence", "retrieval-server")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    not_run: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        start, language = index, match.group(1)
        body: list[str] = []
        index += 1
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index])
            index += 1
        previous = lines[start - 1].strip() if start > 0 else ""
        blocks.append(Block(path, start + 1, language, "\n".join(body) + "\n", previous == NOT_RUN))
        index += 1
    return blocks


ALL_BLOCKS = [block for path in DOC_FILES for block in code_blocks(path)]


def _expand_braces(words: list[str]) -> list[list[str]]:
    """``{serve,build,recall}`` in a command stands for each alternative."""
    for position, word in enumerate(words):
        match = re.fullmatch(r"\{([\w-]+(?:,[\w-]+)+)\}", word)
        if match:
            return [
                expanded
                for alternative in match.group(1).split(",")
                for expanded in _expand_braces([*words[:position], alternative, *words[position + 1 :]])
            ]
    return [words]


def command_lines(block: Block) -> list[list[str]]:
    """Every ``verl-evidence``/``retrieval-server`` invocation of a shell block, as argv lists."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    commands = []
    for raw in joined.splitlines():
        line = raw.strip().removeprefix("$ ")
        if not re.match(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:verl-evidence|retrieval-server)\b", line):
            continue
        words = shlex.split(line, comments=True)  # a broken quote in a CLI example fails collection loudly
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):  # VAR=value prefixes
            words = words[1:]
        if not words or words[0] not in CLI_NAMES:
            continue
        for stop in ("&", "&&", "|", ";"):
            if stop in words:
                words = words[: words.index(stop)]
        words = [w for w in words if w not in ("...", "…")]
        commands.extend(_expand_braces(words))
    return commands


CLI_COMMANDS = [
    pytest.param(words, id=f"{block.where}:{' '.join(words[:3])}")
    for block in ALL_BLOCKS
    if block.language in ("bash", "sh", "shell", "console", "")
    for words in command_lines(block)
]


def test_the_docs_show_cli_commands() -> None:
    shown = {tuple(words[:2]) for words in (p.values[0] for p in CLI_COMMANDS)}
    for expected in [
        ("verl-evidence", "serve"),
        ("verl-evidence", "eval"),
        ("verl-evidence", "demo"),
        ("verl-evidence", "data"),
    ]:
        assert expected in shown, f"no docs example of {' '.join(expected)}"


def resolve(words: list[str]):
    """(click command, number of words naming it) for an argv starting with the program name."""
    import typer.main

    from retrieval_server.cli import app as server_app
    from verl_evidence.cli import app as main_app

    command = typer.main.get_command(main_app if words[0] == "verl-evidence" else server_app)
    used = 1
    while hasattr(command, "commands") and used < len(words) and words[used] in command.commands:
        command = command.commands[words[used]]
        used += 1
    return command, used


@pytest.mark.parametrize("words", CLI_COMMANDS)
def test_cli_example_parses(words: list[str]) -> None:
    """The subcommand exists and every option is known: the real CLI parses it with --help.

    --help goes right after the subcommand, so it can never be taken as an
    option's value; click still rejects an unknown option or subcommand, and
    --help stops before anything runs.
    """
    from click.testing import CliRunner

    _, used = resolve(words)
    root, _ = resolve(words[:1])
    result = CliRunner().invoke(root, [*words[1:used], "--help", *words[used:]], prog_name=words[0])
    assert result.exit_code == 0 and "Usage" in result.output, (
        f"`{shlex.join(words)}` does not parse against the CLI:\n{result.output}"
    )


INLINE_COMMAND = re.compile(r"`((?:verl-evidence|retrieval-server) [^`]*)`")


def test_inline_cli_mentions_name_real_commands_and_options() -> None:
    """`verl-evidence ...` in prose: the subcommand path exists and every --option belongs to it."""
    problems, checked = [], 0
    for path in DOC_FILES:
        for match in INLINE_COMMAND.finditer(path.read_text()):
            for words in _expand_braces(match.group(1).split()):
                checked += 1
                command, used = resolve(words)
                rest = words[used:]
                if (
                    rest
                    and hasattr(command, "commands")
                    and rest[0] not in ("…", "...")
                    and not rest[0].startswith("-")
                ):
                    problems.append(f"{path.relative_to(ROOT)}: `{match.group(1)}` (no subcommand {rest[0]!r})")
                    continue
                known = {
                    opt for param in command.params for opt in [*param.opts, *getattr(param, "secondary_opts", [])]
                }
                unknown = sorted({w.split("=")[0] for w in rest if w.startswith("--")} - known)
                if unknown:
                    problems.append(f"{path.relative_to(ROOT)}: `{match.group(1)}` (unknown {unknown})")
    assert checked > 5
    assert not problems, "\n".join(problems)


def test_a_bad_cli_example_is_caught() -> None:
    """The check above can fail: a misspelt option and an unknown subcommand are rejected."""
    from click.testing import CliRunner

    root, _ = resolve(["verl-evidence"])
    misspelt = CliRunner().invoke(root, ["serve", "--help", "--top-k", "3"])
    assert misspelt.exit_code != 0 and "No such option" in misspelt.output
    unknown = CliRunner().invoke(root, ["index", "bulid", "--help"])
    assert unknown.exit_code != 0 and "No such command" in unknown.output


YAML_BLOCKS = [pytest.param(b, id=b.where) for b in ALL_BLOCKS if b.language in ("yaml", "yml")]


@pytest.mark.parametrize("block", YAML_BLOCKS)
def test_yaml_block_parses(block: Block) -> None:
    try:
        document = yaml.safe_load(block.text)
    except yaml.YAMLError as error:
        pytest.fail(f"{block.where}: YAML does not parse: {error}")
    assert isinstance(document, (dict, list)), f"{block.where}: not a mapping or list"


PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.language in ("python", "py")]


def test_every_python_block_compiles_or_is_marked() -> None:
    assert PYTHON_BLOCKS, "no python blocks found: the parser is broken"
    for block in PYTHON_BLOCKS:
        if block.not_run:
            continue
        compile(block.text, block.where, "exec")


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """A fresh interpreter outside the checkout; it imports this checkout through tests/conftest.py's PYTHONPATH."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=540
    )


def test_python_blocks_run_against_this_checkout(tmp_path: Path) -> None:
    result = run_python("import verl_evidence; print(verl_evidence.__file__)", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert Path(result.stdout.strip()) == ROOT / "verl_evidence" / "__init__.py"


@pytest.mark.slow
@pytest.mark.timeout(600)  # a block's subprocess has 540 s
@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in PYTHON_BLOCKS if not b.not_run])
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    result = run_python(block.text, tmp_path)
    assert result.returncode == 0, f"{block.where} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, flags=re.MULTILINE)}


def test_relative_links_resolve() -> None:
    problems = []
    checked = 0
    for path in DOC_FILES:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            checked += 1
            if not resolved.exists():
                problems.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                problems.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert checked > 10, "too few links found: the parser is broken"
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_index_lists_every_docs_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    linked = {(ROOT / "docs" / target.partition("#")[0]).resolve() for target in LINK.findall(index)}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md") if p.name != "index.md"}
    assert not pages - linked, f"docs/index.md misses {sorted(str(p.relative_to(ROOT)) for p in pages - linked)}"


REPO_PATH = re.compile(r"`((?:verl_evidence|retrieval_server|recipes|docs|tests|benchmarks)/[^`\s*<>{}]*)`")


def test_repository_paths_named_in_the_docs_exist() -> None:
    """`verl_evidence/...`, `recipes/...` and the like, in prose or code spans, name real files or folders."""
    missing = []
    for path in [
        *DOC_FILES,
        ROOT / "verl_evidence" / "bundled" / "README.md",
        ROOT / "recipes" / "slurm" / "README.md",
    ]:
        for match in REPO_PATH.finditer(path.read_text()):
            target = match.group(1).rstrip(".,:;)").split("::")[0]
            if not (ROOT / target).exists():
                missing.append(f"{path.relative_to(ROOT)}: {target}")
    for block in ALL_BLOCKS:  # scripts run in shell examples
        for script in re.findall(r"(?<![\w/.])((?:recipes|benchmarks|docs)/[\w/.-]+\.(?:sh|sbatch|py))", block.text):
            if not (ROOT / script).exists():
                missing.append(f"{block.where}: {script}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


HYDRA_OVERRIDE = re.compile(r"^\+{0,2}[a-z_]+(?:\.[A-Za-z_0-9]+)+=")


def hydra_overrides(block: Block) -> list[str]:
    """The dotted ``key=value`` Hydra overrides of a shell block, as the shell would pass them."""
    overrides = []
    for line in re.sub(r"\\\n\s*", " ", block.text).splitlines():
        overrides += [word for word in shlex.split(line, comments=True) if HYDRA_OVERRIDE.match(word)]
    return overrides


OVERRIDE_BLOCKS = [
    pytest.param(hydra_overrides(b), id=b.where) for b in ALL_BLOCKS if b.language == "bash" and hydra_overrides(b)
]


@pytest.fixture(scope="module")
def compose_ppo_trainer():
    """Compose verl's own ppo_trainer.yaml with overrides, as ``main_ppo`` does."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")

    def run(overrides: list[str]):
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose(config_name="ppo_trainer", overrides=overrides)

    return run


def test_the_docs_show_hydra_overrides() -> None:
    assert len(OVERRIDE_BLOCKS) >= 5


@pytest.mark.parametrize("overrides", OVERRIDE_BLOCKS)
def test_hydra_overrides_compose_with_verls_config(overrides: list[str], compose_ppo_trainer) -> None:
    """Every key without ``+`` exists in verl 0.9's config, every ``+`` key is new, values parse."""
    config = compose_ppo_trainer(overrides)
    for override in overrides:
        key = override.lstrip("+").split("=", 1)[0]
        if key.startswith("hydra."):  # Hydra's own settings (hydra.searchpath): not in the job's config
            continue
        assert key.split(".")[-1] in config_keys(config, key), override


def config_keys(config, dotted: str) -> set[str]:
    from omegaconf import OmegaConf

    parent = OmegaConf.select(config, dotted.rsplit(".", 1)[0])
    return set(parent.keys()) if parent is not None else set()


def test_a_misspelt_override_fails_to_compose(compose_ppo_trainer) -> None:
    with pytest.raises(Exception, match="reward_kwarg"):
        compose_ppo_trainer(["reward.reward_kwarg.alpha=2.0"])
