"""The recipes' printed trainer commands, for the tests that read them: ``bash recipes/<script> --dry-run`` and the
command parsed back as a shell would.

Importable by every test module (pytest puts ``tests/`` on sys.path for tests/conftest.py).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"


# What decides whether a searching recipe would retrieve from the bundled demo corpus; cleared for every test run.
RETRIEVAL_CHOICE = ("RETRIEVAL_URL", "SERVER_ARGS", "ALLOW_DEMO_CORPUS")


def recipe_env(**env: str) -> dict[str, str]:
    # (RAY_ADDRESS too: a test session's Ray must not make a --smoke run join its cluster)
    base = {key: value for key, value in os.environ.items() if key not in (*RETRIEVAL_CHOICE, "RAY_ADDRESS")}
    return {**base, "PYTHON": "python", **env}


def dry_run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(RECIPES / script), "--dry-run", *args],
        capture_output=True,
        text=True,
        env=recipe_env(**env),
        cwd=REPO,
        timeout=60,
    )


def trainer_argv(stdout: str) -> list[str]:
    """The printed trainer command, parsed back exactly as a shell would."""
    assert stdout.count("# trainer:\n") == 1, stdout
    tokens = shlex.split(stdout.split("# trainer:\n", 1)[1].replace("\\\n", " "))
    assert tokens[:3] == ["python", "-m", "verl.trainer.main_ppo"], tokens[:3]
    return tokens[3:]


def overrides(argv: list[str]) -> dict[str, str]:
    pairs = [a.lstrip("+").split("=", 1) for a in argv if "=" in a and not a.startswith("--")]
    return dict(pairs)
