"""The runtime registry: device type -> runtime class, with torch-native fallback.

The registry that ``ppe.to`` and ``ppe.runtime.runtime_registry`` use is the active plugin
host's; this package never imports the host: whoever composes the layers (``ppe_core``'s
``__init__``) hands it a source with :func:`set_registry_source`.

Beyond PPE, a device that is neither a non-empty str nor a ``torch.device``, a type no runtime
serves and PyTorch does not know, and a runtime registered as an instance or for a device raise
errors naming the cause and the fix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ppe_core._registry import Registry
from ppe_core.errors import (
    ArgumentTypeError,
    ConfigurationError,
    RuntimeNotFoundError,
    RuntimeReplacedWarning,
)
from ppe_core.runtime._runtime import BaseRuntime, DeviceLike, PyTorchRuntime

__all__ = [
    "RuntimeRegistry",
    "RuntimeReplacedWarning",
    "active_registry",
    "device_type_of",
    "is_torch_device_type",
    "set_registry_source",
]

#: Returns the active registry; set once by ``ppe_core``'s ``__init__``, before any lookup.
_source: Callable[[], RuntimeRegistry]


def set_registry_source(source: Callable[[], RuntimeRegistry]) -> None:
    """Make ``source()`` the registry :func:`active_registry` returns (set once, at import of
    ``ppe_core``, to the active plugin host's registry)."""
    global _source
    _source = source


def active_registry() -> RuntimeRegistry:
    """The registry ``ppe.to`` resolves with (``ppe.runtime.runtime_registry``)."""
    return _source()


def device_type_of(device: DeviceLike) -> str:
    """The device type of ``"cuda:1"``, ``torch.device("cuda", 1)`` or ``"cpu"``."""
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str) and device:
        return device.split(":", 1)[0]
    raise device_error(device)


@functools.cache
def is_torch_device_type(device_type: str) -> bool:
    try:
        torch.device(device_type)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


class RuntimeRegistry(Registry[type[BaseRuntime]]):
    """Maps device types to :class:`BaseRuntime` subclasses.

    Keeps PPE's calls: ``register(device_type, runtime_class)`` and
    ``get_runtime_class_for_device_spec(device)``. As in PPE, user code may register over a
    device type that already has a runtime: the new class replaces the old one, with a
    :class:`RuntimeReplacedWarning` naming both (``replace=True`` replaces silently; the same
    class again changes nothing). A plugin that registers a taken device type from its
    ``ppe_register_runtimes`` hook still raises
    :class:`~ppe_core.errors.DuplicateRegistrationError` unless it passes ``replace=True``: two
    installed plugins claiming one device is a conflict to resolve, not to guess. A device type
    a first-party plugin serves is never taken by another plugin's hook without the user's
    consent (see :class:`~ppe_core._registry.Registry` and docs/plugins.md). :meth:`register`
    raises :class:`~ppe_core.errors.ArgumentTypeError` for an object that is not a runtime
    class and :class:`~ppe_core.errors.ConfigurationError` for a device (``"cuda:1"``) instead
    of a device type.

    Args:
        describe_failures: As for :class:`~ppe_core._registry.Registry`.
        provider_failure: Returns why the plugin that declares a device type is unavailable
            (failed or blocked), or ``None``.
        default_device: Answers ``device="auto"`` (the ``ppe_default_device`` hook).
    """

    replaced_warning = RuntimeReplacedWarning

    def __init__(
        self,
        describe_failures: Callable[[], str] | None = None,
        provider_failure: Callable[[str], str | None] | None = None,
        default_device: Callable[[], str] | None = None,
    ) -> None:
        super().__init__("runtime", describe_failures)
        self._provider_failure = provider_failure
        self._default_device = default_device

    def resolve_device(self, device: DeviceLike) -> DeviceLike:
        """``device`` itself, or for ``"auto"`` the ``ppe_default_device`` hook's answer.

        Raises:
            ConfigurationError: ``"auto"`` and no plugin names a default device.
        """
        if not (isinstance(device, str) and device == "auto"):
            return device
        if self._default_device is None:
            raise ConfigurationError(
                "device='auto' needs a plugin that names a default device; pass an explicit "
                "device such as 'cpu'"
            )
        return self._default_device()

    def _validate(self, name: str, obj: object) -> None:
        check_runtime_registration(name, obj, BaseRuntime)

    def get_runtime_class_for_device_spec(self, device: DeviceLike) -> type[BaseRuntime]:
        """The runtime class for ``device``.

        Lookup order: a registered runtime for the device type; otherwise, for a device type
        PyTorch knows, the generic :class:`PyTorchRuntime`, unless the plugin that provides it
        failed to load or was blocked.

        Raises:
            RuntimeNotFoundError: no runtime can serve ``device``; the message lists registered
                runtimes, plugins that failed to load and what to install.
        """
        device_type = device_type_of(device)
        if device_type in self:
            return self.get(device_type)  # get() imports a lazily registered runtime
        return self._fallback(device_type)

    def _fallback(self, device_type: str) -> type[BaseRuntime]:
        """The class for an unregistered ``device_type``: the generic runtime, refused for a
        device type whose plugin failed to load or was blocked, or that PyTorch does not know."""
        problem = self._provider_failure(device_type) if self._provider_failure else None
        if problem is None and is_torch_device_type(device_type):
            return PyTorchRuntime
        hint = problem or unknown_device_hint(device_type)
        raise RuntimeNotFoundError(self._not_found_message(device_type, hint))


class _RuntimeRegistry(RuntimeRegistry):
    """PPE's registry class: unknown device types resolve to ``fallback_class``.

    ``ppe.runtime.runtime_registry`` is the plugin host's :class:`RuntimeRegistry`; this class
    exists for code that builds a registry of its own the PPE way.
    """

    def __init__(self, fallback_class: type[BaseRuntime]) -> None:
        super().__init__()
        self._fallback_class = fallback_class

    def _fallback(self, device_type: str) -> type[BaseRuntime]:
        """Every unregistered device type gets the fallback class, as in PPE."""
        return self._fallback_class


def check_runtime_registration(name: str, obj: object, base: type) -> None:
    """``obj`` must be a subclass of ``base`` (a runtime class), registered for a device type."""
    if not (isinstance(obj, type) and issubclass(obj, base)):
        what = "an instance" if isinstance(obj, base) else "not a runtime class"
        raise ArgumentTypeError(
            f"runtime for {name!r} must be a subclass of ppe_core.runtime.BaseRuntime, "
            f"got {obj!r} ({what}); register the class itself, e.g. "
            f"register({name!r}, MyRuntime) with class MyRuntime(PyTorchRuntime)"
        )
    if ":" in name:
        raise ConfigurationError(
            f"runtimes are registered for a device type, not a device: got {name!r}; "
            f"register {name.split(':', 1)[0]!r} instead (the runtime receives the full "
            "device spec when constructed)"
        )


def device_error(device: object) -> ConfigurationError:
    """Why ``device`` names no device type: an empty string, or neither a str nor a
    ``torch.device``."""
    if isinstance(device, str):
        return ConfigurationError(
            "device is an empty string; pass a device such as 'cpu', 'cuda:0' or 'auto'"
        )
    return ArgumentTypeError(
        f"device must be a str or a torch.device, got {type(device).__name__} {device!r}; pass "
        "e.g. device='cpu', device='cuda:0' or torch.device('cuda', 0)"
    )


def unknown_device_hint(device_type: str) -> str:
    """What to do about ``device_type`` when no runtime serves it and PyTorch does not know it."""
    return (
        f"{device_type!r} is not a PyTorch device type either. Install the plugin that "
        "provides it (first-party plugins: pip install ppe-cpu / pip install ppe-cuda), "
        "or register one with ppe_core.runtime.runtime_registry.register"
        f"({device_type!r}, MyRuntime)."
    )
