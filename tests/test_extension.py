"""Tests for Extension, make_extension and ExtensionEntry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from ppe_core.errors import ConfigurationError
from ppe_core.training._protocols import ManagerView
from ppe_core.training.extension import (
    PRIORITY_EDITOR,
    PRIORITY_READER,
    PRIORITY_SNAPSHOT,
    PRIORITY_WRITER,
    Extension,
    ExtensionEntry,
    ExtensionNameError,
    make_extension,
)
from ppe_core.training.manager import ExtensionsManager
from ppe_core.training.triggers import IntervalTrigger, ManualScheduleTrigger


class _NullWriter:
    def initialize(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def finalize(self) -> None:
        pass


def _manager() -> ExtensionsManager:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return ExtensionsManager(model, optimizer, 1, iters_per_epoch=2, writer=_NullWriter())


class Counter(Extension):
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, manager: ManagerView) -> None:
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        self.count = int(to_load["count"])


def test_priorities_match_ppe() -> None:
    assert (PRIORITY_WRITER, PRIORITY_EDITOR, PRIORITY_READER, PRIORITY_SNAPSHOT) == (
        300,
        200,
        100,
        -100,
    )


def test_extension_defaults() -> None:
    ext = Counter()
    trigger: object = ext.trigger
    assert trigger == (1, "iteration")
    assert ext.priority == PRIORITY_READER
    assert ext.name is None
    assert ext.needs_model_state is False
    assert ext.is_async is False
    assert ext.default_name == "Counter"
    assert ext.state_dict() == {"count": 0}


def test_base_extension_must_override_call_and_has_noop_hooks() -> None:
    ext = Extension()
    manager = _manager()
    with pytest.raises(NotImplementedError, match="Extension must override __call__"):
        ext(manager)
    ext.initialize(manager)
    ext.finalize(manager)
    ext.on_error(manager, RuntimeError("x"), None)
    assert ext.state_dict() == {}
    ext.load_state_dict({})


def test_make_extension_sets_defaults_and_attributes() -> None:
    @make_extension()
    def plain(manager: ManagerView) -> None:
        pass

    assert plain.trigger == (1, "iteration")  # type: ignore[attr-defined]
    assert plain.priority == PRIORITY_READER  # type: ignore[attr-defined]
    assert plain.default_name == "plain"  # type: ignore[attr-defined]

    @make_extension(trigger=(2, "epoch"), default_name="Custom", priority=PRIORITY_WRITER)
    def configured(manager: ManagerView) -> None:
        pass

    entry = ExtensionEntry(configured)
    assert entry.name == "Custom"
    assert entry.priority == PRIORITY_WRITER
    assert isinstance(entry.trigger, IntervalTrigger)
    assert (entry.trigger.period, entry.trigger.unit) == (2, "epoch")


def test_make_extension_honours_extra_attributes() -> None:
    @make_extension(needs_model_state=True, is_async=True)
    def reads_model(manager: ManagerView) -> None:
        pass

    reads_model.custom_flag = "yes"  # type: ignore[attr-defined]
    extension = ExtensionEntry(reads_model).extension
    assert extension.needs_model_state is True
    assert extension.is_async is True
    assert extension.custom_flag == "yes"  # type: ignore[attr-defined]
    assert ExtensionEntry(reads_model).needs_model_state is True


def test_make_extension_hooks_are_called_through_the_entry() -> None:
    calls: list[tuple[str, Any]] = []
    manager = _manager()

    @make_extension(
        initializer=lambda m: calls.append(("init", m)),
        finalizer=lambda m: calls.append(("final", m)),
        on_error=lambda m, exc, tb: calls.append(("error", exc)),
    )
    def ext(m: ManagerView) -> str:
        calls.append(("call", m))
        return "result"

    extension = ExtensionEntry(ext).extension
    error = ValueError("boom")
    extension.initialize(manager)
    assert extension(manager) == "result"
    extension.on_error(manager, error, None)
    extension.finalize(manager)
    assert calls == [("init", manager), ("call", manager), ("error", error), ("final", manager)]


def test_plain_callable_object_state_is_forwarded() -> None:
    class Stateful:
        def __init__(self) -> None:
            self.value = 0

        def __call__(self, manager: ManagerView) -> None:
            self.value += 1

        def state_dict(self) -> dict[str, int]:
            return {"value": self.value}

        def load_state_dict(self, to_load: Mapping[str, int]) -> None:
            self.value = to_load["value"]

    original = Stateful()
    original.value = 7
    restored = Stateful()
    ExtensionEntry(restored).load_state_dict(ExtensionEntry(original).state_dict())
    assert restored.value == 7
    assert ExtensionEntry(restored).name == "_WrappedExtension"  # PPE's default name


def test_entry_arguments_override_extension_attributes() -> None:
    ext = Counter()
    entry = ExtensionEntry(
        ext, name="counter", priority=0, trigger=(3, "iteration"), call_before_training=True
    )
    assert entry.name == "counter"
    assert ext.name == "counter"  # the extension learns its registered name, as in PPE
    assert entry.priority == 0  # 0 is a valid priority, not "unset"
    assert isinstance(entry.trigger, IntervalTrigger)
    assert entry.trigger.period == 3
    assert entry.call_before_training is True
    assert entry.extension is ext


def test_entry_takes_name_attribute_then_default_name() -> None:
    class Named(Counter):
        name = "fixed"

    class Default(Counter):
        @property
        def default_name(self) -> str:
            return "from_property"

    assert ExtensionEntry(Named()).name == "fixed"
    assert ExtensionEntry(Default()).name == "from_property"


@pytest.mark.parametrize("bad", ["training", ""])
def test_entry_rejects_reserved_and_empty_names(bad: str) -> None:
    with pytest.raises(ExtensionNameError, match="name"):
        ExtensionEntry(Counter(), name=bad)
    assert issubclass(ExtensionNameError, ConfigurationError)


def test_entry_state_dict_covers_extension_and_trigger() -> None:
    ext = Counter()
    ext.count = 4
    entry = ExtensionEntry(ext, trigger=ManualScheduleTrigger([2, 5], "iteration"))
    state = entry.state_dict()
    assert set(state) == {"extension", "trigger"}
    assert state["extension"] == {"count": 4}

    fresh = Counter()
    ExtensionEntry(fresh).load_state_dict(state)
    assert fresh.count == 4
    # PPE wrote None for extensions without state; such a part is skipped.
    ExtensionEntry(fresh).load_state_dict({"extension": None, "trigger": None})
    assert fresh.count == 4


def test_wrapped_extension_survives_copy() -> None:
    import copy

    @make_extension(needs_model_state=True)
    def ext(manager: ManagerView) -> None:
        pass

    wrapped = ExtensionEntry(ext).extension
    clone = copy.deepcopy(wrapped)
    assert clone.needs_model_state is True
    assert clone.default_name == "ext"
