"""verl's per-step metrics read from verl's file logger: what the smoke runs, the demo and the benchmarks read.

``trainer.logger=[console,file]`` makes verl's ``FileLogger`` write one JSON line
per ``Tracking.log`` call, ``{"step": N, "data": {metric: value}}``, to
``$VERL_FILE_LOGGER_PATH`` (the smoke runs set it: ``recipes/_common.sh``). Reading
that file, not verl's console lines, keeps every metric exactly as verl computed it.
Step 0 is the validation before training; a step logged twice (never, today) keeps
both sets of metrics, the later winning on a clash.
"""

from __future__ import annotations

import json
from pathlib import Path

FILE_LOGGER_ENV = "VERL_FILE_LOGGER_PATH"
METRICS_LINE = "# metrics (verl's file logger): "  # what recipes/_common.sh prints for a smoke run


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list) and len(value) == 1:  # a one-element array (orjson's numpy serialisation)
        return _number(value[0])
    return None


def parse_record(line: str) -> tuple[int, dict[str, float]] | None:
    """One file-logger line as ``(step, numeric metrics)``; None for a blank or partly written line."""
    line = line.strip()
    if not line:
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    data = record.get("data") if isinstance(record, dict) else None
    if not isinstance(data, dict) or "step" not in record:
        return None
    values = {key: number for key, value in data.items() if (number := _number(value)) is not None}
    return int(record["step"]), values


def read_metrics(path: str | Path) -> dict[int, dict[str, float]]:
    """Every step's numeric metrics from a verl file-logger JSONL file."""
    steps: dict[int, dict[str, float]] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            parsed = parse_record(line)
            if parsed is not None:
                steps.setdefault(parsed[0], {}).update(parsed[1])
    return steps


class MetricsTail:
    """The steps a running trainer has logged so far: each :meth:`new_steps` call returns the ones not seen yet."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = ""

    def new_steps(self) -> dict[int, dict[str, float]]:
        if not self.path.exists():
            return {}
        with open(self.path, encoding="utf-8") as handle:
            if self.path.stat().st_size < self._offset:  # rewritten by a new run: start over
                self._offset, self._partial = 0, ""
            handle.seek(self._offset)
            chunk = handle.read()
            self._offset = handle.tell()
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the rest
        steps: dict[int, dict[str, float]] = {}
        for line in lines:
            parsed = parse_record(line)
            if parsed is not None:
                steps.setdefault(parsed[0], {}).update(parsed[1])
        return steps


def metrics_path(output: str) -> Path | None:
    """The file-logger path a smoke run printed (``# metrics (verl's file logger): PATH``), if any."""
    for line in output.splitlines():
        if line.startswith(METRICS_LINE):
            return Path(line[len(METRICS_LINE) :].strip())
    return None
