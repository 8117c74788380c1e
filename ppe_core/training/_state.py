"""The manager's state dictionary: its keys, the PPE format version it is written in, and the
version check on loading (``ExtensionsManager.state_dict``/``load_state_dict`` use them)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from ppe_core._version import __version__
from ppe_core.errors import StateVersionWarning
from ppe_core.training._resume import VERSION_KEY

__all__ = [
    "PPE_CORE_STATE_KEY",
    "PPE_FORMAT_VERSION",
    "VERSION_KEY",
    "TransformModel",
    "check_version",
]

#: ``transform_model(name, model)`` returns the module whose state is saved and observed.
TransformModel = Callable[[str, torch.nn.Module], torch.nn.Module]

#: The key under which ppe-core keeps its own resume data in a state dictionary. PPE's
#: ``load_state_dict`` ignores unknown top-level keys, so such states still load into PPE.
PPE_CORE_STATE_KEY = "_ppe_core"
#: The PPE release whose state format ppe-core writes, saved as ``state['ppe_version']``: PPE
#: warns on load unless that field equals its own version, so ppe-core's version goes under
#: ``state['_ppe_core']['version']`` (:data:`VERSION_KEY`) instead.
PPE_FORMAT_VERSION = "0.9.0"
# PPE releases whose states load without a StateVersionWarning (the format is the same).
_COMPATIBLE_PPE_VERSIONS = ("0.9.",)


def check_version(saved: object) -> None:
    """Warns (as PPE does) when a state was written by another or an unknown version."""
    if saved == __version__ or (
        isinstance(saved, str) and saved.startswith(_COMPATIBLE_PPE_VERSIONS)
    ):
        return
    written = "an unknown version" if saved is None else f"version {saved}"
    warnings.warn(
        StateVersionWarning(
            f"the loaded state was written by {written} (ppe-core is {__version__}, compatible "
            "with PPE 0.9); it loads, but states from other versions may differ"
        ),
        stacklevel=3,  # the caller of ExtensionsManager.load_state_dict
    )
