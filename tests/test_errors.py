"""Every exception and warning class a user can meet is importable from ``ppe_core.errors``."""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import cache
from pathlib import Path

import pytest

import ppe_core
import ppe_core.errors as errors
from ppe_core.errors import PPEError, PPEWarning

DOCS = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
# Built-in exceptions that say nothing beyond "an error": a class must also subclass another.
_GENERIC = {BaseException, Exception, Warning, UserWarning, object}


def _walk(package: str) -> list[str]:
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if info.name.rsplit(".", 1)[-1] != "__main__":
            names.append(info.name)
    return names


@cache
def exception_classes(package: str) -> dict[str, type[BaseException]]:
    """Public exception classes defined in ``package`` and its modules, by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for name in _walk(package):
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and not value.__name__.startswith("_")
            ):
                found[f"{name}.{value.__qualname__}"] = value
    return found


def _builtin_bases(cls: type) -> set[type]:
    return {c for c in cls.__mro__ if c.__module__ == "builtins"} - _GENERIC


def test_the_walk_finds_classes_in_private_modules() -> None:
    found = exception_classes("ppe_core")
    assert found["ppe_core.errors.PPEError"] is PPEError
    # The walk sees classes of private modules too: the plugins' runtime modules hold some.
    assert any("._" in name for name in exception_classes("ppe_cuda"))


def test_every_error_class_is_defined_in_ppe_core_errors() -> None:
    # errors.py is the bottom layer: a class defined elsewhere would make it import that
    # module (the lazy map it once had put it in one import circle with the training stack).
    elsewhere = sorted(
        q for q in exception_classes("ppe_core") if not q.startswith("ppe_core.errors.")
    )
    assert not elsewhere, f"define these in ppe_core/errors.py and re-export them: {elsewhere}"


def test_every_exception_class_is_importable_from_ppe_core_errors() -> None:
    missing = [
        qualified
        for qualified, cls in exception_classes("ppe_core").items()
        if getattr(errors, cls.__name__, None) is not cls or cls.__name__ not in errors.__all__
    ]
    assert not missing, f"not listed in ppe_core.errors.__all__: {missing}"


#: Public modules that re-export errors.py's classes where PPE code or our docs import them.
_OLD_PATHS = {
    "ppe_core.config": "ConfigCycleError ConfigKeyError",
    "ppe_core.distributed": "CollectiveTimeoutError DistributedEnvironmentError "
    "ProcessGroupNotInitializedError",
    "ppe_core.reporting": "EmptySummaryError NoCurrentReporterError UnknownObserverError",
    "ppe_core.runtime": "RuntimeOptionTypeError",
    "ppe_testing": "ConformanceError EmulatedDeviceError",
    "ppe_core.training.extension": "DuplicateExtensionError ExtensionNameError",
    "ppe_core.training.extensions.evaluator": "IgnoredArgumentWarning MissingEvalTargetError "
    "OptionalDependencyError",
    "ppe_core.training.manager": "ExtensionErrorHandlerWarning IgniteNotInstalledError "
    "IgnoredArgumentWarning ManagerStateError MissingExtensionStateWarning "
    "ModelStateUnavailableError StateDictKeyError StateDictMismatchError StateVersionWarning",
    "ppe_core.training.metrics": "MetricInputError MetricKeyError",
    "ppe_core.training.triggers": "MissingObservationWarning TriggerTypeError",
    "ppe_core.writing": "DiskFullError WriterError WriterFinalizedError",
}


@pytest.mark.parametrize("module", sorted(_OLD_PATHS))
def test_old_import_paths_give_the_same_class(module: str) -> None:
    imported = importlib.import_module(module)
    for name in _OLD_PATHS[module].split():
        assert getattr(imported, name) is getattr(errors, name), f"{module}.{name}"
    # The private twins re-export too (tests and user code of earlier releases import them).
    from ppe_extensions._snapshot import SnapshotError, SnapshotRanksError

    from ppe_core.training._manager import ManagerStateError

    assert ManagerStateError is errors.ManagerStateError
    assert (SnapshotError, SnapshotRanksError) == (errors.SnapshotError, errors.SnapshotRanksError)


def test_ppe_core_errors_lists_only_what_it_provides() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert isinstance(cls, type) and issubclass(cls, (PPEError, PPEWarning)), name
    assert set(errors.__all__) <= set(dir(errors))
    with pytest.raises(AttributeError, match="NoSuchError"):
        errors.NoSuchError  # noqa: B018


def test_every_exception_class_is_documented() -> None:
    documented = DOCS.read_text() + (errors.__doc__ or "")
    undocumented = [
        qualified
        for qualified, cls in exception_classes("ppe_core").items()
        if not re.search(rf"\b{cls.__name__}\b", documented)
    ]
    assert not undocumented, (
        f"not named in docs/errors.md nor errors.py's docstring: {undocumented}"
    )


def test_errors_subclass_the_project_base_and_a_specific_builtin() -> None:
    wrong = []
    for qualified, cls in exception_classes("ppe_core").items():
        if issubclass(cls, Warning):
            if not issubclass(cls, PPEWarning):
                wrong.append(f"{qualified}: a warning that is not a PPEWarning")
        elif not issubclass(cls, PPEError):
            wrong.append(f"{qualified}: not a PPEError")
        elif cls is not PPEError and not _builtin_bases(cls):
            wrong.append(f"{qualified}: no builtin a PPE user would catch (ValueError, ...)")
    assert not wrong, wrong


@pytest.mark.parametrize("plugin", ["ppe_cpu", "ppe_cuda"])
def test_plugin_errors_subclass_a_ppe_core_error_users_can_catch(plugin: str) -> None:
    specific = {getattr(errors, name) for name in errors.__all__} - {PPEError, PPEWarning}
    for qualified, cls in exception_classes(plugin).items():
        bases = [c for c in cls.__mro__[1:] if c in specific]
        assert bases, f"{qualified} subclasses no ppe_core.errors class besides the bases"


def test_device_plugin_unavailability_is_a_device_unavailable_error() -> None:
    from ppe_cuda import CUDAUnavailableError

    assert issubclass(CUDAUnavailableError, errors.DeviceUnavailableError)
    assert issubclass(CUDAUnavailableError, RuntimeError)


def test_one_class_per_name_where_two_modules_raised_it() -> None:
    from ppe_extensions import _accumulate, _lr_scheduler
    from ppe_extensions import _evaluator as extension_evaluator

    from ppe_core.training import _evaluator

    assert _accumulate.MissingObservationError is errors.MissingObservationError
    assert _lr_scheduler.MissingObservationError is errors.MissingObservationError
    assert _evaluator.DistributedNotInitializedError is errors.DistributedNotInitializedError
    assert extension_evaluator.DistributedNotInitializedError is (
        errors.DistributedNotInitializedError
    )
    # Both earlier bases are kept, so code catching either still works.
    assert issubclass(errors.MissingObservationError, KeyError)
    assert issubclass(errors.MissingObservationError, ValueError)
    assert str(errors.MissingObservationError("'val/loss' was not reported")) == (
        "'val/loss' was not reported"
    )


def test_lazily_provided_classes_keep_their_identity() -> None:
    from ppe_core.training.manager import ManagerStateError
    from ppe_core.writing import WriterError

    assert errors.ManagerStateError is ManagerStateError
    assert errors.WriterError is WriterError
    assert ppe_core.errors is errors
