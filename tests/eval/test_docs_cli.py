"""docs/evaluation.md's command lines and option table name only options the CLI really has."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

DOC = Path(__file__).parents[2] / "docs" / "evaluation.md"


def _options(command_name: str) -> set[str]:
    from verl_evidence.cli import app

    group = typer.main.get_command(app)
    command = group.commands[command_name]
    return {opt for param in command.params for opt in param.opts}


def _doc_command_lines() -> list[str]:
    text = DOC.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    joined = [b.replace("\\\n", " ") for b in blocks]
    return [
        line.strip() for block in joined for line in block.splitlines() if line.strip().startswith("verl-evidence ")
    ]


def test_every_documented_command_line_uses_existing_options() -> None:
    lines = _doc_command_lines()
    assert any(" eval" in line for line in lines) and any(" demo" in line for line in lines)
    for line in lines:
        words = line.split("#")[0].split()
        command = words[1]
        known = _options(command)
        used = {w.split("=")[0] for w in words[2:] if w.startswith("--")}
        assert used <= known, (line, sorted(used - known))


def test_the_option_table_matches_the_eval_command() -> None:
    text = DOC.read_text()
    table = text.split("| option | meaning |", 1)[1].split("\n\n", 1)[0]
    spans = re.findall(r"`([^`]*)`", table)
    documented = {opt for span in spans for opt in re.findall(r"--[a-z][a-z-]*", span)}
    known = _options("eval")
    assert documented <= known, sorted(documented - known)
    # every eval option is documented
    assert {o for o in known if o.startswith("--") and o != "--help"} <= documented, sorted(
        {o for o in known if o.startswith("--")} - documented
    )
