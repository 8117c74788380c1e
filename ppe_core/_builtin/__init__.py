"""ppe-core's built-in plugins: hook implementations only, registered like external plugins.

They register names with lazy ``"module:attribute"`` targets (``Registry.register_lazy``), so
plugin discovery imports no extension, handler or training module until one is looked up.
"""

from __future__ import annotations
