"""ppe-mlflow: the MLflow experiment-tracking extension for ppe-core.

Importing it is cheap: mlflow itself is imported by the tracker's worker thread when the run opens.
"""

from __future__ import annotations

from ppe_mlflow._logger import MLflowLogger

__all__ = ["MLflowLogger"]
