"""verl's console metrics (``step:N - key:value - ...`` lines) as numbers: what smoke runs and the demo read."""

from __future__ import annotations

import re

_METRIC = re.compile(r"([\w/@.-]+):(?:np\.\w+\()?(-?[0-9.]+(?:e[-+]?[0-9]+)?|nan|inf)\)?")


def step_metrics(output: str) -> dict[int, dict[str, float]]:
    """Every ``step:N - key:value - ...`` line of verl's console logger, as floats per step."""
    steps: dict[int, dict[str, float]] = {}
    for line in output.splitlines():
        found = line.find("step:")
        if found < 0 or " - " not in line[found:]:
            continue
        head, _, rest = line[found:].partition(" - ")
        try:
            step = int(head.split(":", 1)[1])
        except ValueError:
            continue
        steps[step] = {key: float(value) for key, value in _METRIC.findall(rest)}
    return steps
