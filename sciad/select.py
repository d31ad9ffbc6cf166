"""Choosing a sensealg: `select_sensealg` returns a `Choice` (with `report()`); `"auto"` is
`heuristic(features(...))` with the committed `THRESHOLDS`; `candidates` and `measure` are what the
autotuner times. Exposed whole so that a benchmark can validate the rule out of sample."""

from sciad._auto import RULES, THRESHOLDS, Choice, Features, Thresholds, heuristic
from sciad._select import candidates, features, measure, select_sensealg

__all__ = [
    "RULES",
    "THRESHOLDS",
    "Choice",
    "Features",
    "Thresholds",
    "candidates",
    "features",
    "heuristic",
    "measure",
    "select_sensealg",
]
