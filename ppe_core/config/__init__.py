"""PPE's configuration system: a JSON/YAML tree whose dicts build objects when first read.

Same path and behaviour as ``pytorch_pfn_extras.config``: ``Config(tree, types)``,
``'@/path'`` references, ``type`` keys looked up in ``types``, lazy evaluation with each object
built once, :func:`customize_type` defaults, ``Config.load_path`` with ``import`` keys (YAML
needs the ``yaml`` extra) and ``update_via_args``. Not imported by ``import ppe_core``.
"""

from __future__ import annotations

from ppe_core.config._config import (
    AttrKey,
    Config,
    ConfigKey,
    ConfigType,
    DumpTrace,
    KeyPair,
    Loader,
    LoadTrace,
    customize_type,
)
from ppe_core.errors import ConfigCycleError, ConfigKeyError

__all__ = [
    "AttrKey",
    "Config",
    "ConfigCycleError",
    "ConfigKey",
    "ConfigKeyError",
    "ConfigType",
    "DumpTrace",
    "KeyPair",
    "LoadTrace",
    "Loader",
    "customize_type",
]
