"""The runtime registry: device type -> runtime class, with torch-native fallback."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch

from ppe_core._registry import Registry, _caller_registrant, _describe
from ppe_core.errors import (
    ArgumentTypeError,
    ConfigurationError,
    RuntimeNotFoundError,
    RuntimeReplacedWarning,
)
from ppe_core.runtime._runtime import BaseRuntime, DeviceLike, PyTorchRuntime

__all__ = ["RuntimeRegistry", "RuntimeReplacedWarning", "device_type_of"]


#: Device types whose runtime ships as a first-party plugin, for install hints.
FIRST_PARTY_PROVIDERS = {"cpu": "ppe-cpu", "cuda": "ppe-cuda"}


def device_type_of(device: DeviceLike) -> str:
    """The device type of ``"cuda:1"``, ``torch.device("cuda", 1)`` or ``"cpu"``."""
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        if not device:
            raise ConfigurationError(
                "device is an empty string; pass a device such as 'cpu', 'cuda:0' or 'auto'"
            )
        return device.split(":", 1)[0]
    raise ArgumentTypeError(
        f"device must be a str or a torch.device, got {type(device).__name__} {device!r}; pass "
        "e.g. device='cpu', device='cuda:0' or torch.device('cuda', 0)"
    )


@functools.cache
def _is_torch_device_type(device_type: str) -> bool:
    try:
        torch.device(device_type)
    except (RuntimeError, ValueError):
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
    consent (see :class:`~ppe_core._registry.Registry` and docs/plugins.md).
    """

    def __init__(
        self,
        describe_failures: Callable[[], str] | None = None,
        provider_failure: Callable[[str], str | None] | None = None,
    ) -> None:
        super().__init__("runtime", describe_failures)
        # Returns why a device type's known provider is unavailable (failed or blocked).
        self._provider_failure = provider_failure

    def register(
        self, name: str, obj: type[BaseRuntime], *, replace: bool = False
    ) -> type[BaseRuntime]:
        """Register ``obj`` for the device type ``name`` and return it.

        Raises:
            DuplicateRegistrationError: a plugin hook registers a taken device type without
                ``replace=True``.
            ArgumentTypeError: ``obj`` is not a runtime class, or ``name`` not a string.
            ConfigurationError: ``name`` is a device (``"cuda:1"``), not a device type.
        """
        if self._current_registrant is not None:  # inside a plugin's hook
            return super().register(name, obj, replace=replace)
        previous = self._entries.get(name) if isinstance(name, str) else None
        if previous is not None and previous.obj is obj and not replace:
            return obj  # the same class again (e.g. set-up code run twice): nothing changes
        if previous is not None and not replace:
            self._validate(name, obj)  # a bad object raises before anything is replaced
            warnings.warn(
                RuntimeReplacedWarning(
                    f"runtime for device type {name!r} replaced: {_describe(obj)} now serves "
                    f"{name!r} instead of {_describe(previous.obj)} (registered by "
                    f"{previous.registrant}). Pass replace=True to replace it without this "
                    f"warning; unregister({name!r}) restores the previous runtime."
                ),
                stacklevel=2,
            )
            replace = True
        # Attribute the entry to our caller, not to this override.
        self._current_registrant = _caller_registrant(1)
        try:
            return super().register(name, obj, replace=replace)
        finally:
            self._current_registrant = None

    def _validate(self, name: str, obj: object) -> None:
        if not (isinstance(obj, type) and issubclass(obj, BaseRuntime)):
            what = "an instance" if isinstance(obj, BaseRuntime) else "not a runtime class"
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
        if device_type in self._entries:
            return self.get(device_type)  # get() imports a lazily registered runtime
        provider = FIRST_PARTY_PROVIDERS.get(device_type)
        problem = self._provider_failure(device_type) if self._provider_failure else None
        if problem is None and _is_torch_device_type(device_type):
            return PyTorchRuntime
        if problem is not None:
            hint = problem
        elif provider is not None:
            hint = f"Install its plugin: pip install {provider}"
        else:
            hint = (
                f"{device_type!r} is not a PyTorch device type either. Install the plugin that "
                "provides it (first-party plugins: pip install ppe-cpu / pip install ppe-cuda), "
                "or register one with ppe_core.runtime.runtime_registry.register"
                f"({device_type!r}, MyRuntime)."
            )
        raise RuntimeNotFoundError(self._not_found_message(device_type, hint))


class _RuntimeRegistry(RuntimeRegistry):
    """PPE's registry class: unknown device types resolve to ``fallback_class``.

    ``ppe.runtime.runtime_registry`` is the plugin host's :class:`RuntimeRegistry`; this class
    exists for code that builds a registry of its own the PPE way.
    """

    def __init__(self, fallback_class: type[BaseRuntime]) -> None:
        super().__init__()
        self._fallback_class = fallback_class

    def get_runtime_class_for_device_spec(self, device: DeviceLike) -> type[BaseRuntime]:
        """The class registered for ``device``'s type, else the fallback class."""
        device_type = device_type_of(device)
        return self.get(device_type) if device_type in self._entries else self._fallback_class
