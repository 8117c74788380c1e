"""FailOnNonNumber: stops training as soon as a parameter or gradient holds NaN or inf."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch

from ppe_core.errors import NonFiniteParameterError
from ppe_core.training.extension import Extension

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView

__all__ = ["FailOnNonNumber", "NonFiniteParameterError"]

# Offending parameters named in the error; the rest are counted.
_MAX_LISTED = 10


def _all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Checks every tensor with one device-to-host transfer per device."""
    flags: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        flags.setdefault(tensor.device, []).append(torch.isfinite(tensor).all())
    return all(bool(torch.stack(device_flags).all()) for device_flags in flags.values())


def _problems(tensor: torch.Tensor) -> str:
    checks = (("NaN", torch.isnan), ("inf", torch.isinf))
    return " and ".join(kind for kind, check in checks if bool(check(tensor).any()))


class FailOnNonNumber(Extension):
    """Raises when a parameter of a model, or its gradient, contains NaN or inf.

    Diverged parameters stay NaN for the rest of training, so stopping early saves the
    compute and points at the cause. The error names the optimizer and every offending
    parameter by its qualified name (``main: fc.weight``).

    This extension synchronizes the host with the device each time it runs (it must read the
    result of the check); it runs every iteration by default, as in PPE. Pass a sparser
    trigger, e.g. ``extend(FailOnNonNumber(), trigger=(100, 'iteration'))``, to check less
    often on accelerators.

    Args:
        check_grad: Also check the gradients; set False to check the parameters only.
    """

    needs_model_state = True

    def __init__(self, *, check_grad: bool = True) -> None:
        self._check_grad = check_grad

    def _tensors(self, models: Mapping[str, torch.nn.Module]) -> Iterable[torch.Tensor]:
        for model in models.values():
            for param in model.parameters():
                yield param.detach()
                if self._check_grad and param.grad is not None:
                    yield param.grad

    def __call__(self, manager: ManagerView) -> None:
        """Checks every parameter of ``manager.models``.

        Raises:
            NonFiniteParameterError: A parameter or a gradient holds NaN or inf.
        """
        models = manager.models
        with torch.no_grad():
            if not _all_finite(self._tensors(models)):
                raise NonFiniteParameterError(self._describe(manager, models))

    def _describe(self, manager: ManagerView, models: Mapping[str, torch.nn.Module]) -> str:
        owners: dict[int, list[str]] = {}
        for opt_name, optimizer in manager.optimizers.items():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    owners.setdefault(id(param), []).append(opt_name)
        by_optimizer: dict[str, list[str]] = {}
        for model_name, model in models.items():
            for param_name, param in model.named_parameters():
                checked = {"value": param.detach()}
                if self._check_grad and param.grad is not None:
                    checked["gradient"] = param.grad
                found = [
                    f"{what} has {kinds}" for what, t in checked.items() if (kinds := _problems(t))
                ]
                if not found:
                    continue
                entry = f"{model_name}: {param_name} ({'; '.join(found)})"
                for opt_name in owners.get(id(param), ["<no optimizer>"]):
                    by_optimizer.setdefault(opt_name, []).append(entry)
        lines = [
            f"training diverged: non-finite values after iteration {manager.iteration} "
            f"(epoch {manager.epoch})"
        ]
        for opt_name, entries in by_optimizer.items():
            listed = entries[:_MAX_LISTED]
            more = len(entries) - len(listed)
            suffix = f", and {more} more" if more else ""
            lines.append(f"  optimizer {opt_name!r}: {', '.join(listed)}{suffix}")
        lines.append(
            "Try a lower learning rate, gradient clipping (torch.nn.utils.clip_grad_norm_), or "
            "check the data and the loss for NaN/inf (torch.autograd.set_detect_anomaly(True) "
            "shows the operation that produced them)."
        )
        return "\n".join(lines)
