"""Public extensions-manager API at PPE's path ``ppe.training.manager``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppe_core._not_provided import module_getattr
from ppe_core.errors import (
    ExtensionErrorHandlerWarning,
    IgniteNotInstalledError,
    IgnoredArgumentWarning,
    ManagerStateError,
    MissingExtensionStateWarning,
    ModelStateUnavailableError,
    StateDictKeyError,
    StateDictMismatchError,
    StateVersionWarning,
)
from ppe_core.training._ignite import IgniteExtensionsManager
from ppe_core.training._manager import (
    ExtensionsManager,
    StopReason,
    TransformModel,
    default_transform_model,
    identity_transform_model,
)
from ppe_core.training._protocols import StateObjectProtocol

__all__ = [
    "ExtensionErrorHandlerWarning",
    "ExtensionsManager",
    "IgniteExtensionsManager",
    "IgniteNotInstalledError",
    "IgnoredArgumentWarning",
    "ManagerStateError",
    "MissingExtensionStateWarning",
    "ModelStateUnavailableError",
    "StateDictKeyError",
    "StateDictMismatchError",
    "StateObjectProtocol",
    "StateVersionWarning",
    "StopReason",
    "TransformModel",
    "default_transform_model",
    "identity_transform_model",
]


if not TYPE_CHECKING:  # PPE's names left out here say what to use (docs/migration.md)
    __getattr__ = module_getattr(__name__)
