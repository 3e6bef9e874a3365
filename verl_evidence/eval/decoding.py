"""How ``eval`` decodes: each method with its paper's inference settings, greedy, or settings a user names.

``--decoding paper`` (the default) looks up the method of each row (``extra_info.method``) in
:data:`PAPER_DECODING`; ``greedy`` decodes every row greedily; ``temperature=0.6,top_p=0.9`` (any of
``temperature``, ``top_p``, ``top_k``) applies those settings to every row, greedy for the rest. The settings
replace the validation sampling verl would take from ``actor_rollout_ref.rollout.val_kwargs`` and are recorded
with every result.

Where each paper's settings come from (read in each paper's experimental setup):

- GRACE, Table 2, "Inference" column: temperature 0.6, top_p 0.9.
- EviOmni and LEAR (A.2 / §4.1 "Implementation Details"): no decoding stated; greedy is ours.
- EviNote-RAG (§4.4): temperature 1.0 among its training settings; nothing for evaluation,
  so greedy is ours.
- EviPath (Appendix E): vLLM for synthesis, no decoding stated; greedy is ours.
- The Search-R1 baseline: not one of the five papers; greedy is ours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "GREEDY",
    "PAPER_DECODING",
    "DecodingChoice",
    "DecodingError",
    "Sampling",
    "parse_decoding",
]


class DecodingError(ValueError):
    """A ``--decoding`` value that names no setting we know, or an impossible one."""


@dataclass(frozen=True)
class Sampling:
    """One method's inference sampling; ``temperature`` 0 is greedy (verl's convention), ``top_k`` -1 is off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    source: str = "[ours] greedy"

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


GREEDY = Sampling()
_OURS = "[ours] greedy: the paper states no inference decoding"
# The method of a row (extra_info.method, dataprep's names) -> its paper's inference sampling.
PAPER_DECODING: dict[str, Sampling] = {
    "grace": Sampling(temperature=0.6, top_p=0.9, source="[paper] GRACE Table 2 (inference)"),
    "eviomni": Sampling(source=_OURS),
    "lear": Sampling(source=_OURS),
    "evinote": Sampling(source="[ours] greedy: the paper's temperature 1.0 is a training setting"),
    "evipath": Sampling(source=_OURS),
    "search_r1": Sampling(source="[ours] greedy: a baseline, not one of the five papers"),
}
# Rows without extra_info.method: the rollout family's method.
_FAMILY_METHOD = {"grace": "grace", "eviomni": "eviomni", "search": "search_r1"}
_KEYS = {"temperature": float, "top_p": float, "top_k": int}


@dataclass(frozen=True)
class DecodingChoice:
    """What ``--decoding`` chose: ``paper``, ``greedy`` or the user's settings (``overrides``)."""

    name: str
    overrides: tuple[tuple[str, float | int], ...] = ()

    def for_row(self, row: Mapping[str, Any], rollout: str) -> Sampling:
        """The sampling of one row, by its method (``extra_info.method``, else its rollout family's)."""
        if self.name == "greedy":
            return GREEDY
        if self.name == "paper":
            extra = row.get("extra_info") or {}
            method = extra.get("method") if isinstance(extra, Mapping) else None
            return PAPER_DECODING.get(str(method), PAPER_DECODING[_FAMILY_METHOD.get(rollout, "search_r1")])
        return Sampling(**dict(self.overrides), source=f"[user] --decoding {self.name}")

    def describe(self) -> str:
        """One line for the report: what each method decoded with."""
        if self.name == "greedy":
            return "Decoding: greedy for every method (--decoding greedy)."
        if self.name != "paper":
            return f"Decoding: {self.name} for every method (--decoding)."
        parts = [f"{method} {_settings(sampling)} ({sampling.source})" for method, sampling in PAPER_DECODING.items()]
        return "Decoding: each method as its paper states (--decoding paper): " + "; ".join(parts) + "."


def _settings(sampling: Sampling) -> str:
    if sampling.temperature == 0:
        return "greedy"
    text = f"temperature {sampling.temperature:g}, top_p {sampling.top_p:g}"
    return text + (f", top_k {sampling.top_k}" if sampling.top_k > 0 else "")


def parse_decoding(text: str | None) -> DecodingChoice:
    """``paper`` (also for None), ``greedy``, or ``KEY=VALUE[,KEY=VALUE...]`` with keys temperature, top_p, top_k."""
    value = "paper" if text is None else text.strip()
    if value in ("paper", "greedy"):
        return DecodingChoice(value)
    settings: dict[str, float | int] = {}
    for item in value.split(","):
        key, sep, number = item.partition("=")
        key = key.strip()
        if not sep or key not in _KEYS:
            raise DecodingError(
                f"--decoding {text!r}: expected paper, greedy or KEY=VALUE[,KEY=VALUE] with KEY one of "
                f"{', '.join(_KEYS)} (e.g. temperature=0.6,top_p=0.9)"
            )
        if key in settings:
            raise DecodingError(f"--decoding {text!r}: {key} is given twice")
        try:
            settings[key] = _KEYS[key](number.strip())
        except ValueError:
            raise DecodingError(f"--decoding {text!r}: {key}={number.strip()!r} is not a number") from None
    temperature, top_p, top_k = settings.get("temperature", 0.0), settings.get("top_p", 1.0), settings.get("top_k", -1)
    if not math.isfinite(temperature) or temperature < 0:
        raise DecodingError(f"--decoding {text!r}: temperature must be a finite number >= 0 (0 is greedy)")
    if not math.isfinite(top_p) or not 0 < top_p <= 1:
        raise DecodingError(f"--decoding {text!r}: top_p must be in (0, 1]")
    if top_k == 0 or top_k < -1:
        raise DecodingError(f"--decoding {text!r}: top_k must be positive, or -1 for off")
    if temperature == 0 and (top_p != 1.0 or top_k != -1):
        raise DecodingError(f"--decoding {text!r}: top_p / top_k need a temperature above 0 (0 is greedy)")
    canonical = ",".join(f"{key}={settings[key]:g}" for key in _KEYS if key in settings)
    return DecodingChoice(canonical, tuple((key, settings[key]) for key in _KEYS if key in settings))
