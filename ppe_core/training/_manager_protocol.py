"""PPE's private path ``training._manager_protocol``, kept for the protocols scripts annotate
with (``ExtensionsManagerProtocol``, ``StateObjectProtocol``)."""

from __future__ import annotations

from ppe_core.training._protocols import ExtensionsManagerProtocol, StateObjectProtocol

__all__ = ["ExtensionsManagerProtocol", "StateObjectProtocol"]
