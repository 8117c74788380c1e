"""Handlers and logics: how a step runs, independent of the device it runs on."""

from __future__ import annotations

from ppe_core.handler._handler import BaseHandler, Handler, NoRuntimeError
from ppe_core.handler._logic import BaseLogic, BatchMismatchError, Logic, ModelOutputError

__all__ = [
    "BaseHandler",
    "BaseLogic",
    "BatchMismatchError",
    "Handler",
    "Logic",
    "ModelOutputError",
    "NoRuntimeError",
]
