"""Handlers and logics: how a step runs, independent of the device it runs on."""

from __future__ import annotations

from ppe_core.errors import (
    AMPOptionError,
    BackwardOutputWarning,
    BatchMismatchError,
    ModelOutputError,
)
from ppe_core.handler._code_block import (
    CodeBlock,
    CodeBlockError,
    CodeBlockLogic,
    forward,
    update_parameters,
)
from ppe_core.handler._handler import BaseHandler, Handler, NoRuntimeError, step_function
from ppe_core.handler._logic import (
    BaseLogic,
    ClousureLogic,
    Logic,
    ModelLogic,
    keep_modes,
    torch_autocast,
)

__all__ = [
    "AMPOptionError",
    "BackwardOutputWarning",
    "BaseHandler",
    "BaseLogic",
    "BatchMismatchError",
    "ClousureLogic",
    "CodeBlock",
    "CodeBlockError",
    "CodeBlockLogic",
    "Handler",
    "Logic",
    "ModelLogic",
    "ModelOutputError",
    "NoRuntimeError",
    "forward",
    "keep_modes",
    "step_function",
    "torch_autocast",
    "update_parameters",
]
