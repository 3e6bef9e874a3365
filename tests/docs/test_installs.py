"""The GPU installs the quickstart prints resolve for Linux x86_64, as a cluster user runs them.

Every ``pip install -e ".[...]"`` / ``uv pip install -e ".[...]"`` line of the quickstart's install section is
resolved with ``uv pip compile`` for the platform the page names, with the extras installed so far in the same
block (the environment a user has after that line) and any ``--override`` file the line passes. ``--exclude-newer``
pins the registry to a date, so a new release cannot change the answer; move the date when the pins move.

Needs the package registry, as ``make install`` does.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .test_docs import ROOT, code_blocks

PAGE = ROOT / "docs" / "quickstart.md"
REGISTRY_AS_OF = "2026-12-01"
PYTHON = "3.11"
# The oldest glibc each engine's wheels install on; the page says the same next to each block.
PLATFORM = {"vllm": "x86_64-manylinux_2_28", "sglang": "x86_64-manylinux_2_34"}
EDITABLE = re.compile(r'^(?:uv )?pip install -e "\.\[([a-z0-9_,-]+)\]"(.*)$')

pytestmark = [pytest.mark.slow, pytest.mark.mostly_waits]  # waits on the registry


def documented_installs() -> list[tuple[str, list[str], list[str]]]:
    """(the line, the extras installed after it, its extra uv arguments) for each editable install line."""
    section = PAGE.read_text().split("### 1. Install with the inference engine", 1)[1].split("\n### ", 1)[0]
    installs = []
    for block in code_blocks(PAGE):
        if block.language not in ("bash", "sh") or block.text not in section:
            continue
        installed: list[str] = []
        for raw in block.text.splitlines():
            for command in raw.split("&&"):
                match = EDITABLE.match(command.split("#", 1)[0].strip())
                if not match:
                    continue
                installed += [e for e in match.group(1).split(",") if e not in installed]
                installs.append((command.strip(), list(installed), shlex.split(match.group(2))))
    return installs


def test_the_page_prints_an_install_for_each_engine() -> None:
    extras = [set(after) for _, after, _ in documented_installs()]
    assert {"serve", "vllm"} in extras
    assert {"serve", "vllm", "gpu"} in extras
    assert {"serve", "sglang"} in extras


@pytest.mark.parametrize("line, extras, uv_args", documented_installs(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_documented_install_resolves_for_linux_x86_64(line: str, extras: list[str], uv_args: list[str], tmp_path):
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is installed by `make install` (it installs the venv)"
    engine = next(e for e in PLATFORM if e in extras)
    for i, arg in enumerate(uv_args[:-1]):  # files the line names, relative to the checkout as the page assumes
        if arg == "--override":
            assert (ROOT / uv_args[i + 1]).is_file(), f"{line}: {uv_args[i + 1]} does not exist"
            uv_args[i + 1] = str(ROOT / uv_args[i + 1])
    requirements = tmp_path / "requirements.in"
    requirements.write_text(f"verl-evidence[{','.join(extras)}] @ {ROOT.as_uri()}\n")
    command = [
        uv, "pip", "compile", str(requirements), "-q", "--no-header",
        "--python-version", PYTHON, "--python-platform", PLATFORM[engine],
        "--exclude-newer", REGISTRY_AS_OF, *uv_args,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"`{line}` does not resolve for {PLATFORM[engine]}:\n{result.stderr[-3000:]}"
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", result.stdout, flags=re.M))
    assert pins.get("verl", "").startswith("0.9."), pins.get("verl")
    assert engine in pins, f"{engine} is missing from the resolution of `{line}`"
    if "gpu" in extras:
        assert "faiss-gpu-cu12" in pins
