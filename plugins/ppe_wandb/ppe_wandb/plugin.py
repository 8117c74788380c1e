"""ppe-core hook implementations of ppe-wandb (cheap: the tracker loads on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppe_core import hookimpl

if TYPE_CHECKING:
    from ppe_core.plugins import Registry

# The ppe-core hook API this plugin was written for (checked when the plugin registers).
PPE_CORE_HOOK_API = (1, 0)


@hookimpl
def ppe_register_extensions(registry: Registry[Any]) -> None:
    """``ppe_core.training.extensions.WandbLogger`` becomes available.

    Registered by name: ``ppe_wandb._logger`` (and the tracking machinery it imports) loads at the
    first lookup, so discovery costs nothing in runs that use no tracker.
    """
    registry.register_lazy("WandbLogger", "ppe_wandb._logger:WandbLogger")
