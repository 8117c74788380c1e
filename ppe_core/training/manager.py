"""Public extensions-manager API at PPE's path ``ppe.training.manager``."""

from __future__ import annotations

from ppe_core.training._manager import (
    ExtensionErrorHandlerWarning,
    ExtensionsManager,
    IgnoredArgumentWarning,
    ManagerStateError,
    MissingExtensionStateWarning,
    ModelStateUnavailableError,
    StateDictKeyError,
    StateDictMismatchError,
    TransformModel,
    default_transform_model,
    identity_transform_model,
)

__all__ = [
    "ExtensionErrorHandlerWarning",
    "ExtensionsManager",
    "IgnoredArgumentWarning",
    "ManagerStateError",
    "MissingExtensionStateWarning",
    "ModelStateUnavailableError",
    "StateDictKeyError",
    "StateDictMismatchError",
    "TransformModel",
    "default_transform_model",
    "identity_transform_model",
]
