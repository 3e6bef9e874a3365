"""Every recipe value tagged as a paper's is one the paper states.

A value in ``recipes/*.sh`` or ``recipes/presets/**/*.yaml`` may carry, in the comment on its line,
``[paper: REF]`` (the paper states it at REF) or ``[ours, from the paper's grid: REF]`` (we chose it from a grid
the paper searched). REF names an entry of ``paper_values.yaml`` beside this file, where the value is transcribed
with a few words of the paper that hold it; those words are checked against the paper's text when the papers are
beside the checkout (``../shared/seeds``, present in CI, not for users).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VALUES = yaml.safe_load((Path(__file__).with_name("paper_values.yaml")).read_text(encoding="utf-8"))
SEEDS = REPO.parent / "shared" / "seeds"

TAG = re.compile(r"\[(paper|ours, from the paper's grid)(?::\s*([^\]]*))?\]")
SH_ASSIGNMENT = re.compile(r'\b([A-Z][A-Z0-9_]*)="\$\{\1:-([^}]*)\}"')
YAML_ENTRY = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*):\s*(.+?)\s*$")


def recipe_files(root: Path = REPO) -> list[Path]:
    return sorted((root / "recipes").glob("*.sh")) + sorted((root / "recipes" / "presets").rglob("*.yaml"))


def tagged_lines(root: Path = REPO) -> list[tuple[str, str, str]]:
    """(where, suffix, line) of every recipe or preset line whose comment holds a tag."""
    found = []
    for path in recipe_files(root):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if TAG.search(line.partition("#")[2]):
                found.append((f"{path.relative_to(root)}:{number}", path.suffix, line))
    return found


def tagged_values(where: str, suffix: str, line: str) -> list[tuple[str, str, str, object]]:
    """(tag kind, REF, name, value) for every value the line's tag covers; a tag without a reference, or on a
    line that sets nothing (a legend, a block comment), fails: it cannot be checked."""
    code, _, comment = line.partition("#")
    tags = TAG.findall(comment)
    assert len(tags) == 1, f"{where}: one tag a line (split the line), got {tags}"
    ((kind, ref),) = tags
    assert ref.strip(), f"{where}: [{kind}] names no reference; write [{kind}: <where in the paper>]"
    if suffix == ".sh":
        values = [(name, value) for name, value in SH_ASSIGNMENT.findall(code)]
    else:
        entry = YAML_ENTRY.match(code)
        values = [(entry.group(1), yaml.safe_load(entry.group(2)))] if entry and entry.group(2) else []
    assert values, f"{where}: the tag [{kind}: {ref}] is on a line that sets no value"
    return [(kind, ref.strip(), name, value) for name, value in values]


def same(value: object, expected: object) -> bool:
    if isinstance(expected, list):
        return isinstance(value, list) and [str(v) for v in value] == [str(v) for v in expected]
    try:
        return math.isclose(float(value), float(expected), rel_tol=1e-9)
    except (TypeError, ValueError):
        return str(value) == str(expected)


def check(where: str, kind: str, ref: str, name: str, value: object) -> None:
    assert ref in VALUES, f"{where}: [{kind}: {ref}] names no entry of tests/recipes/paper_values.yaml"
    if kind == "paper":
        listed = VALUES[ref].get("values", {})
        assert name.lower() in listed, f"{where}: {ref} states no {name} (paper_values.yaml lists {sorted(listed)})"
        expected = listed[name.lower()]["value"]
        assert same(value, expected), f"{where}: {name}={value!r}, but {ref} states {expected!r}"
    else:
        grids = VALUES[ref].get("grids", {})
        assert name.lower() in grids, f"{where}: {ref} gives no grid for {name}"
        grid = grids[name.lower()]["values"]
        assert any(same(value, option) for option in grid), f"{where}: {name}={value!r} is not in {ref}'s grid {grid}"


TAGGED = tagged_lines()


def test_the_recipes_tag_values_at_all() -> None:
    refs = {ref for where, suffix, line in TAGGED for _, ref, _, _ in tagged_values(where, suffix, line)}
    assert {"GRACE Table 2", "EviOmni A.2", "EviNote §4.4", "LEAR §4.1", "EviNote Eq. 2"} <= refs


@pytest.mark.parametrize(("where", "suffix", "line"), TAGGED, ids=[t[0] for t in TAGGED])
def test_a_tagged_value_is_the_papers(where: str, suffix: str, line: str) -> None:
    for kind, ref, name, value in tagged_values(where, suffix, line):
        check(where, kind, ref, name, value)


def test_a_bare_or_wrong_tag_is_refused() -> None:
    """The checker itself: an unreferenced tag, a tag on a line without a value, a value the reference does not
    state, and a grid value outside the grid fail, naming where."""
    with pytest.raises(AssertionError, match=r"x.sh:1: \[paper\] names no reference"):
        tagged_values("x.sh:1", ".sh", 'LR="${LR:-1e-6}"  # [paper]')
    with pytest.raises(AssertionError, match="on a line that sets no value"):
        tagged_values("x.sh:2", ".sh", "# Sources: [paper: EviOmni A.2] the paper's")
    ((kind, ref, name, value),) = tagged_values("x.yaml:3", ".yaml", "  tau: 0.5   # [paper: EviOmni A.2]")
    with pytest.raises(AssertionError, match="EviOmni A.2 states no tau"):
        check("x.yaml:3", kind, ref, name, value)
    line = 'TAU="${TAU:-0.4}"  # [ours, from the paper\'s grid: EviOmni A.2]'
    ((kind, ref, name, value),) = tagged_values("x.sh:4", ".sh", line)
    with pytest.raises(AssertionError, match="is not in EviOmni A.2's grid"):
        check("x.sh:4", kind, ref, name, value)
    ((kind, ref, name, value),) = tagged_values("x.sh:5", ".sh", 'LR="${LR:-2e-6}"  # [paper: EviOmni A.2]')
    with pytest.raises(AssertionError, match="LR='2e-6', but EviOmni A.2 states 1e-06"):
        check("x.sh:5", kind, ref, name, value)


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the papers' texts are not beside the checkout ({SEEDS})")
def test_every_transcribed_value_is_in_its_papers_text() -> None:
    def normal(text: str) -> str:
        return " ".join(text.split())

    for ref, entry in VALUES.items():
        (paper,) = SEEDS.glob(f"{entry['seed']}_*.txt")
        text = normal(paper.read_text(encoding="utf-8"))
        for kind in ("values", "grids"):
            for name, item in (entry.get(kind) or {}).items():
                assert normal(item["anchor"]) in text, f"{ref} {name}: {item['anchor']!r} is not in {paper.name}"
