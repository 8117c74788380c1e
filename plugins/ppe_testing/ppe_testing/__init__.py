"""ppe-testing: the runtime conformance kit and the emulated device, for runtime authors.

The conformance kit (:class:`RuntimeConformance`, :func:`run_checks` and the ``check_*``
functions) checks a runtime against ppe-core's runtime contract; it never needs pytest except
to run as a test class. :func:`enable_emulated_device` (opt-in, once per process) creates the
emulated device ``ppe_emu``, a non-CPU device type backed by host memory, so the kit can check
a runtime off the CPU. :func:`check_installs_alone` installs a package alone beside ppe-core in
a new venv and runs its tests there (for any plugin's own tests). They load on first use:
``import ppe_testing`` (which entry-point discovery runs, through ``ppe_testing.plugin``) stays
cheap.

Written on ppe-core's public names only, as a third party's kit would be. The errors are
ppe-core's (:class:`~ppe_core.errors.ConformanceError`,
:class:`~ppe_core.errors.EmulatedDeviceError`), re-exported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ppe_core.errors import ConformanceError, EmulatedDeviceError

if TYPE_CHECKING:  # for type checkers only: at run time the names load on first access
    from ppe_testing._conformance import (
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
    from ppe_testing._emulated import (
        EMULATED_DEVICE,
        EmulatedDeviceRuntime,
        EmulatedTensor,
        emulated_device_type,
        enable_emulated_device,
    )
    from ppe_testing._installs_alone import check_installs_alone

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
    "check_installs_alone",
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
    "run_checks",
]

#: The emulated device's names: loaded from ``_emulated`` on first access.
_EMULATED = frozenset(
    {
        "EMULATED_DEVICE",
        "EmulatedDeviceRuntime",
        "EmulatedTensor",
        "emulated_device_type",
        "enable_emulated_device",
    }
)
#: The install check's names: loaded from ``_installs_alone`` on first access.
_INSTALLS_ALONE = frozenset({"check_installs_alone"})
#: The kit's names: loaded from ``_conformance`` on first access.
_CONFORMANCE = (
    frozenset(__all__) - {"ConformanceError", "EmulatedDeviceError"} - _EMULATED - _INSTALLS_ALONE
)
#: The private module each lazily loaded name comes from.
_WHERE = {
    **dict.fromkeys(_CONFORMANCE, "_conformance"),
    **dict.fromkeys(_EMULATED, "_emulated"),
    **dict.fromkeys(_INSTALLS_ALONE, "_installs_alone"),
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is not None:
        value = getattr(importlib.import_module(f"ppe_testing.{where}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
