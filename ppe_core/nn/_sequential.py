"""``ppe.nn.ExtendedSequential``: a ``Sequential`` that can repeat itself (Chainer's ``repeat``)."""

from __future__ import annotations

import copy
import warnings

import torch

from ppe_core.errors import ConfigurationError, ResetParametersWarning

__all__ = ["ExtendedSequential"]

_MODES = ("init", "copy", "share")


def _reinitialize(module: torch.nn.Module) -> None:
    """Re-draw ``module``'s parameters in place, recursing through the container modules.

    A leaf is reset through its ``reset_parameters`` (or ``_reset_parameters``); a leaf with
    neither keeps its values, with a warning if it holds any tensors, because a repeated copy
    would then silently start from the same weights.
    """
    if isinstance(module, torch.nn.Sequential | torch.nn.ModuleList):
        for child in module:
            _reinitialize(child)
        return
    if isinstance(module, torch.nn.ModuleDict):
        for child in module.values():
            _reinitialize(child)
        return
    for method in ("reset_parameters", "_reset_parameters"):
        reset = getattr(module, method, None)
        if reset is not None:
            reset()
            return
    if next(module.parameters(), None) is not None or next(module.buffers(), None) is not None:
        warnings.warn(
            f"cannot re-initialize {type(module).__name__} for repeat(mode='init'): it has "
            "parameters or buffers but no reset_parameters() or _reset_parameters() method; "
            "its copies keep the original values. Add one of those methods to the module.",
            ResetParametersWarning,
            stacklevel=4,
        )


class ExtendedSequential(torch.nn.Sequential):
    """``torch.nn.Sequential`` with :meth:`repeat`, as PPE (after Chainer) provides it."""

    def repeat(self, n_repeat: int, mode: str = "init") -> ExtendedSequential:
        """Return a new ``ExtendedSequential`` holding this one ``n_repeat`` times.

        Args:
            n_repeat: How many times; zero or less gives an empty sequential.
            mode: ``"init"``: deep copies with freshly initialized parameters (each leaf's
                ``reset_parameters``); ``"copy"``: deep copies with the same starting values,
                trained independently; ``"share"``: shallow copies sharing one set of
                parameters.

        Raises:
            ConfigurationError: ``mode`` is not one of the three (a ``ValueError``).
        """
        if n_repeat <= 0:
            # As in PPE, nothing to copy means nothing to validate.
            return ExtendedSequential()
        if mode not in _MODES:
            raise ConfigurationError(
                f"repeat(mode={mode!r}) is not a mode; use one of {', '.join(map(repr, _MODES))}"
            )
        copies: list[torch.nn.Module] = []
        for _ in range(n_repeat):
            if mode == "share":
                copies.append(copy.copy(self))
                continue
            duplicate = copy.deepcopy(self)
            if mode == "init":
                _reinitialize(duplicate)
            copies.append(duplicate)
        return ExtendedSequential(*copies)
