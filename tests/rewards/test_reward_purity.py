"""The reward core stays pure: importing it (and the shared text utilities it reads) pulls in neither verl, torch nor
ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import verl_evidence.rewards
import verl_evidence.text

REWARDS_DIR = Path(verl_evidence.rewards.__file__).parent
TEXT_DIR = Path(verl_evidence.text.__file__).parent
FORBIDDEN = {"verl", "torch", "ray", "numpy"}


def test_no_forbidden_imports_in_source() -> None:
    modules = sorted([*REWARDS_DIR.glob("*.py"), *TEXT_DIR.glob("*.py")])
    assert {p.name for p in modules} >= {"qa_metrics.py", "rouge.py", "tags.py", "eviomni.py", "evinote.py", "grace.py"}
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_importing_the_core_does_not_load_verl_torch_or_ray() -> None:
    code = (
        "import sys\n"
        "import verl_evidence.rewards.qa_metrics, verl_evidence.rewards.rouge, verl_evidence.rewards.eviomni\n"
        "import verl_evidence.text.tags, verl_evidence.text.stops, verl_evidence.text.ground_truth\n"
        "import verl_evidence.rewards.evinote, verl_evidence.rewards.grace\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'verl', 'torch', 'ray'})\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "", f"reward core imported {out.stdout.strip()}"


def test_the_package_lists_exactly_its_modules() -> None:
    """``from verl_evidence.rewards import *`` imports every module ``__all__`` names, and it names each one."""
    package = Path(verl_evidence.rewards.__file__).parent
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    assert sorted(verl_evidence.rewards.__all__) == modules
    namespace: dict = {}
    exec("from verl_evidence.rewards import *", namespace)
    assert set(modules) <= set(namespace)
