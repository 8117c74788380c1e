"""PPE's ``testing`` module path: ``_compare_states``, and ``plugin_host`` for plugin tests.

``_compare_states`` compares two nested states as PPE's ``testing._compare_states`` does (PPE's
tests and test kits import it); ``plugin_host`` gives a test an isolated plugin host, with no
package beyond ppe-core needed.
The runtime conformance kit and the emulated device are the ``ppe-testing`` distribution
(``pip install ppe-testing``, ``from ppe_testing import RuntimeConformance``): their former
names here raise an ``ImportError`` that says so.
"""

from __future__ import annotations

from ppe_core.errors import OptionalDependencyError
from ppe_core.testing._compare import _compare_states as _compare_states
from ppe_core.testing._host import plugin_host

__all__ = ["plugin_host"]

#: The names that moved to ``ppe_testing`` (the kit's and the emulated device's).
_MOVED_TO_PPE_TESTING = frozenset(
    {
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
        "run_checks",
    }
)


def __getattr__(name: str) -> object:
    # An ImportError, not an AttributeError: `from ppe_core.testing import RuntimeConformance`
    # would turn an AttributeError into a bare "cannot import name" and lose the message.
    if name in _MOVED_TO_PPE_TESTING:
        raise OptionalDependencyError(
            f"ppe_core.testing.{name} moved to the ppe-testing distribution with the runtime "
            f"conformance kit and the emulated device: install it (`pip install ppe-testing`, "
            f"or `pip install -e plugins/ppe_testing` in a ppe-core checkout) and import "
            f"`from ppe_testing import {name}`"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
