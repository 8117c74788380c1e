"""PPE's module path of ``to``: ``ppe.runtime._to.to`` is :func:`ppe_core.to`.

Resolution needs the plugin host, so ``to`` lives in the plugin layer (``ppe_core._resolve``);
this module only keeps PPE's path importable.
"""

from __future__ import annotations

from ppe_core._resolve import to

__all__ = ["to"]
