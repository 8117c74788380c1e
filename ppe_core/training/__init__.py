"""Training: the extensions manager, extensions, triggers and the Trainer/Evaluator."""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> defining module; resolved on first access to keep ``import ppe_core`` cheap.
_EXPORTS: dict[str, str] = {
    "ExtensionsManager": "ppe_core.training.manager",
    "Extension": "ppe_core.training.extension",
    "ExtensionEntry": "ppe_core.training.extension",
    "make_extension": "ppe_core.training.extension",
    "PRIORITY_WRITER": "ppe_core.training.extension",
    "PRIORITY_EDITOR": "ppe_core.training.extension",
    "PRIORITY_READER": "ppe_core.training.extension",
    "PRIORITY_SNAPSHOT": "ppe_core.training.extension",
    "Trainer": "ppe_core.training._trainer",
    "Evaluator": "ppe_core.training._evaluator",
    "DistributedEvaluator": "ppe_core.training._evaluator",
    "IgniteExtensionsManager": "ppe_core.training.manager",
    "AccuracyMetric": "ppe_core.training.metrics",
    "ExtensionsManagerProtocol": "ppe_core.training._protocols",
    "StateObjectProtocol": "ppe_core.training._protocols",
    "IterationDriver": "ppe_core.training._protocols",
    "ResumeStateHost": "ppe_core.training._resume",
    "StopReason": "ppe_core.training.manager",
    # For extension packages: the models by name, and where a snapshot extension puts the
    # engine's own resume data (ppe-extensions' snapshots use these).
    "named_models": "ppe_core.training._manager",
    "record_ranks": "ppe_core.training._resume",
    "PPE_CORE_STATE_KEY": "ppe_core.training._state",
}
_SUBMODULES = frozenset({"extension", "extensions", "manager", "metrics", "trigger", "triggers"})

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
