"""Helpers for testing code that uses ppe-core, and the runtime conformance kit.

``plugin_host`` gives a test an isolated plugin host; ``_compare_states`` compares two nested
states as PPE's ``testing._compare_states`` does (PPE's tests and test kits import it). The
conformance kit (:class:`RuntimeConformance`, :func:`run_checks` and the ``check_*``
functions) checks a runtime against the runtime contract; it loads on first use, so
``import ppe_core.testing`` stays cheap, and it never needs pytest except to run as a test
class.
:func:`enable_emulated_device` (opt-in, once per process) creates the emulated device ``ppe_emu``,
a non-CPU device type backed by host memory, so the kit can check a runtime off the CPU.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ppe_core.testing._compare import _compare_states as _compare_states
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
        check_grad_scaler_state,
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
    from ppe_core.testing._emulated import (
        EMULATED_DEVICE,
        EmulatedDeviceError,
        EmulatedDeviceRuntime,
        EmulatedTensor,
        emulated_device_type,
        enable_emulated_device,
    )

__all__ = [
    "CHECKS",
    "EMULATED_DEVICE",
    "CheckResult",
    "ConformanceError",
    "EmulatedDeviceError",
    "EmulatedDeviceRuntime",
    "EmulatedTensor",
    "Pair",
    "RuntimeConformance",
    "RuntimeTarget",
    "check_callback_order",
    "check_convert_batch",
    "check_eval_no_grad",
    "check_grad_scaler_state",
    "check_module_move",
    "check_options_validation",
    "check_snapshot_resume",
    "check_state_dict_round_trip",
    "check_step_hooks",
    "check_tagging",
    "check_tensor_move",
    "check_training_matches_reference",
    "emulated_device_type",
    "enable_emulated_device",
    "plugin_host",
    "run_checks",
]

#: The emulated device's names: loaded from ``_emulated`` on first access.
_EMULATED = frozenset(
    {
        "EMULATED_DEVICE",
        "EmulatedDeviceError",
        "EmulatedDeviceRuntime",
        "EmulatedTensor",
        "emulated_device_type",
        "enable_emulated_device",
    }
)
#: The kit's names: loaded from ``_conformance`` on first access (``plugin_host`` is light).
_CONFORMANCE = frozenset(__all__) - {"plugin_host"} - _EMULATED


def __getattr__(name: str) -> Any:
    if name in _CONFORMANCE or name in _EMULATED:
        where = "_conformance" if name in _CONFORMANCE else "_emulated"
        module = importlib.import_module(f"ppe_core.testing.{where}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
