"""The hook contract between ppe-core and its plugins.

A plugin is a module (or any object) with functions decorated by :data:`hookimpl` whose names
match the specifications below. Installed packages expose a plugin through an entry point in the
``ppe_core`` group::

    [project.entry-points.ppe_core]
    my_device = "my_device_package.plugin"

Rules every hook follows:

* Names start with ``ppe_``; argument names are API (new arguments may be added, none renamed).
  An implementation may accept any subset of a hook's arguments.
* Registration hooks are *historic*: a plugin registered after start-up still receives them.
  They hand the plugin a registry; plugins never import a global registry.
* No hook is called per iteration. Per-step work belongs in extensions and runtimes.

The hook API has a version, :data:`PPE_CORE_HOOK_API`. A plugin module may declare the version
it was written for with an attribute of the same name; the plugin host refuses a plugin whose
declared major version differs, or whose minor version is newer than this one (see
``docs/plugins.md``, "Hook API version").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ppe_core._registry import Registry
    from ppe_core.runtime import RuntimeRegistry

__all__ = [
    "PPE_CORE_HOOK_API",
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "ppe_default_device",
    "ppe_environment_info",
    "ppe_evaluator_setup",
    "ppe_evaluator_teardown",
    "ppe_register_extensions",
    "ppe_register_logics",
    "ppe_register_modules",
    "ppe_register_runtimes",
    "ppe_trainer_setup",
    "ppe_trainer_teardown",
]

#: The version of the hook API below, ``(major, minor)``. The minor version grows when a hook
#: or a hook argument is added (plugins written for an older minor keep working); the major
#: version grows when a hook is removed or its meaning changes. A plugin declares the version
#: it was written for as a module (or object) attribute ``PPE_CORE_HOOK_API = (1, 0)``.
PPE_CORE_HOOK_API: tuple[int, int] = (1, 1)

#: The pluggy project name; also the entry-point group scanned for plugins.
PROJECT_NAME = "ppe_core"

#: Marks a function as a hook specification (used only by ppe-core itself).
hookspec = pluggy.HookspecMarker(PROJECT_NAME)

#: Marks a plugin function as the implementation of a hook, e.g. ``@hookimpl(trylast=True)``.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec(historic=True)
def ppe_register_runtimes(registry: RuntimeRegistry) -> None:
    """Register runtime classes for device types.

    Called once for every plugin, when the plugin is registered (historic), before any user code
    resolves a device. Register with ``registry.register(device_type, runtime_class)``; a
    device type another plugin already registered raises
    :class:`~ppe_core.errors.DuplicateRegistrationError` unless ``replace=True`` is passed.
    A device type a first-party plugin (``ppe-cpu``, ``ppe-cuda``) serves stays with it: another
    plugin's registration of it is skipped with a
    :class:`~ppe_core.errors.PluginConflictWarning`, and ``replace=True`` works only when the
    user names the plugin's distribution in ``PPE_ALLOW_OVERRIDE``.

    Args:
        registry: The runtime registry of the active plugin host.

    Returns:
        Nothing; the return value is ignored.

    Example::

        @ppe_core.hookimpl
        def ppe_register_runtimes(registry):
            from my_device._runtime import MyRuntime  # import lazily: keep start-up cheap
            registry.register("mydev", MyRuntime)
    """


@hookspec(historic=True)
def ppe_register_logics(registry: Registry[Any]) -> None:
    """Register training logics by name, selectable with ``create_trainer(..., logic="name")``.

    Called once for every plugin when it is registered (historic). The registered object is a
    :class:`ppe_core.handler.BaseLogic` subclass or a factory with the same signature.

    Args:
        registry: The logic registry of the active plugin host.

    Returns:
        Nothing; the return value is ignored.

    Example::

        @ppe_core.hookimpl
        def ppe_register_logics(registry):
            registry.register("gan", GANLogic)
    """


@hookspec(historic=True)
def ppe_register_extensions(registry: Registry[Any]) -> None:
    """Register extensions by name; each becomes ``ppe_core.training.extensions.<name>``.

    Called once for every plugin when it is registered (historic). Register classes or factory
    functions under the name users will type, e.g. ``"LogReport"``.

    Args:
        registry: The extension registry of the active plugin host.

    Returns:
        Nothing; the return value is ignored.

    Example::

        @ppe_core.hookimpl
        def ppe_register_extensions(registry):
            registry.register("GradientNorm", GradientNorm)
    """


@hookspec(historic=True)
def ppe_register_modules(registry: Registry[tuple[str, ...]]) -> None:
    """Provide the names of a ppe_core module path that the core keeps only as a face.

    PPE's import paths of the standard extensions and writers
    (``ppe_core.training.extensions.log_report``, ``ppe_core.writing``'s background writers)
    stay files in the core, for scripts and type checkers, but their classes ship in
    ppe-extensions. Such a face looks up the modules registered for its path here and
    forwards its names to them; with no provider installed it names the package to install.
    Called once for every plugin when it is registered (historic).

    Args:
        registry: Module path -> the provider modules searched in order for each name.

    Returns:
        Nothing; the return value is ignored.

    Example::

        @ppe_core.hookimpl
        def ppe_register_modules(registry):
            registry.register(
                "ppe_core.training.extensions.log_report", ("mypkg._log_report",)
            )
    """


@hookspec(firstresult=True)
def ppe_default_device() -> str | None:
    """Name the device that ``device="auto"`` resolves to.

    Called each time a user asks for ``device="auto"`` (``ppe.to``, ``create_trainer``,
    ``create_evaluator``: all through ``ppe_core.plugins.resolve_device``, so they agree). The
    first non-``None`` answer wins, so a plugin whose device is present answers with its device
    string and a generic fallback uses ``@hookimpl(trylast=True)``. Return ``None`` when your
    device is not usable here.

    Returns:
        A device string such as ``"cuda"`` or ``"cpu"``, or ``None`` to abstain.

    Example::

        @ppe_core.hookimpl
        def ppe_default_device():
            import torch
            return "cuda" if torch.cuda.is_available() else None
    """


@hookspec
def ppe_trainer_setup(trainer: Any) -> None:
    """Prepare for a training run.

    Called once at the start of ``Trainer.run()``, after extensions are set up and before the
    first iteration; never per iteration. An exception raised here stops the run as a
    :class:`~ppe_core.errors.PluginHookError` naming the plugin and how to disable it.

    Args:
        trainer: The :class:`ppe_core.training.Trainer` about to run.

    Example::

        @ppe_core.hookimpl
        def ppe_trainer_setup(trainer):
            trainer.manager.observation.clear()
    """


@hookspec
def ppe_trainer_teardown(trainer: Any, exception: BaseException | None) -> None:
    """Clean up after a training run, successful or not.

    Called once when ``Trainer.run()`` ends, including when it raises. Exceptions raised here
    are reported but never replace the training error. Every implementation runs even when
    another raised; wrapper implementations run around the others (see docs/plugins.md).

    Args:
        trainer: The :class:`ppe_core.training.Trainer` that ran.
        exception: The exception that ended the run, or ``None`` when it completed.

    Example::

        @ppe_core.hookimpl
        def ppe_trainer_teardown(trainer, exception):
            if exception is not None:
                print(f"run stopped at iteration {trainer.iteration}: {exception!r}")
    """


@hookspec
def ppe_evaluator_setup(evaluator: Any) -> None:
    """Prepare for an evaluation pass.

    Called once at the start of each ``Evaluator.run()``, before the first batch.

    Args:
        evaluator: The :class:`ppe_core.training.Evaluator` about to run.

    Example::

        @ppe_core.hookimpl
        def ppe_evaluator_setup(evaluator):
            torch.manual_seed(0)  # deterministic augmentation during evaluation
    """


@hookspec
def ppe_evaluator_teardown(evaluator: Any, exception: BaseException | None) -> None:
    """Clean up after an evaluation pass, successful or not.

    Called once when ``Evaluator.run()`` ends, including when it raises.

    Args:
        evaluator: The :class:`ppe_core.training.Evaluator` that ran.
        exception: The exception that ended the pass, or ``None``.

    Example::

        @ppe_core.hookimpl
        def ppe_evaluator_teardown(evaluator, exception):
            release_eval_buffers()
    """


@hookspec
def ppe_environment_info() -> list[str] | None:
    """Describe the environment a plugin sees, for ``python -m ppe_core info``.

    Called only by the ``info`` command and by bug-report helpers; may be slow.

    Returns:
        Lines of text (without newlines), or ``None`` for nothing to add.

    Example::

        @ppe_core.hookimpl
        def ppe_environment_info():
            return [f"mydev driver: {driver_version()}"]
    """
