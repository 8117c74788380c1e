"""Helpers for testing code that uses ppe-core, and the runtime conformance kit.

``plugin_host`` gives a test an isolated plugin host. The conformance kit
(:class:`RuntimeConformance`, :func:`run_checks` and the ``check_*`` functions) checks a
runtime against the runtime contract; it loads on first use, so ``import ppe_core.testing``
stays cheap, and it never needs pytest except to run as a test class.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ppe_core.testing._host import plugin_host

if TYPE_CHECKING:
    from ppe_core.errors import ConformanceError
    from ppe_core.testing._conformance import (
        CHECKS,
        CheckResult,
        Pair,
        RuntimeConformance,
        RuntimeTarget,
        check_callback_order,
        check_convert_batch,
        check_eval_no_grad,
        check_module_move,
        check_options_validation,
        check_snapshot_resume,
        check_state_dict_round_trip,
        check_step_hooks,
        check_tagging,
        check_tensor_move,
        check_training_matches_reference,
        run_checks,
    )

__all__ = [
    "CHECKS",
    "CheckResult",
    "ConformanceError",
    "Pair",
    "RuntimeConformance",
    "RuntimeTarget",
    "check_callback_order",
    "check_convert_batch",
    "check_eval_no_grad",
    "check_module_move",
    "check_options_validation",
    "check_snapshot_resume",
    "check_state_dict_round_trip",
    "check_step_hooks",
    "check_tagging",
    "check_tensor_move",
    "check_training_matches_reference",
    "plugin_host",
    "run_checks",
]

#: The kit's names: loaded from ``_conformance`` on first access (``plugin_host`` is light).
_CONFORMANCE = frozenset(__all__) - {"plugin_host"}


def __getattr__(name: str) -> Any:
    if name in _CONFORMANCE:
        module = importlib.import_module("ppe_core.testing._conformance")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
