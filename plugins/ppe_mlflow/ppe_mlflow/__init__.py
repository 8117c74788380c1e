"""ppe-mlflow: the MLflow experiment-tracking extension for ppe-core.

``MLflowLogger`` loads on first access, so ppe-core importing the plugin module at discovery
stays cheap (MLflow itself is imported by the tracker's worker thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppe_mlflow._logger import MLflowLogger

__all__ = ["MLflowLogger"]


def __getattr__(name: str) -> Any:
    if name == "MLflowLogger":
        from ppe_mlflow._logger import MLflowLogger

        return MLflowLogger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
