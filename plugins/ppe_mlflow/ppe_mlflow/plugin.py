"""ppe-core hook implementations of ppe-mlflow (cheap to import: MLflow loads when used)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core import hookimpl

if TYPE_CHECKING:
    from ppe_core.plugins import Registry

# The ppe-core hook API this plugin was written for (checked when the plugin registers).
PPE_CORE_HOOK_API = (1, 0)


@hookimpl
def ppe_register_extensions(registry: Registry[Any]) -> None:
    """``ppe_core.training.extensions.MLflowLogger`` becomes available."""
    from ppe_mlflow._logger import MLflowLogger

    registry.register("MLflowLogger", MLflowLogger)
