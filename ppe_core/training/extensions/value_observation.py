"""PPE's path ``training.extensions.value_observation``: the value-observation extensions."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["observe_lr", "observe_value"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._value_observation import observe_lr, observe_value
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__)
