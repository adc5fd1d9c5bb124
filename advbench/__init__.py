"""advbench: adversarial-robustness benchmark and NR quality-metric stability tool.

The Python API (`advbench.evaluate` of a module or a `Model`, `evaluate_metric` of a module or a `Metric`, `evaluate_preset`, `preset_cost`,
`plot`, `report`, `summary`, `options`) loads on first use, so that `import advbench` and the command line's help stay light.
"""

from __future__ import annotations

from typing import Any

from advbench.core.version import __version__

_API = ("evaluate", "evaluate_metric", "evaluate_preset", "preset_cost", "plot", "report", "summary", "options", "Model", "Metric")


def __getattr__(name: str) -> Any:
    if name in _API:
        from advbench import api  # torch, the engine and the catalogue: only when the API is used

        return getattr(api, name)
    raise AttributeError(f"module 'advbench' has no attribute '{name}'")


__all__ = ["__version__", *_API]
