"""The Extension base class, the make_extension decorator and ExtensionEntry."""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ppe_core.errors import ExtensionNameError
from ppe_core.training._manager_checks import (
    check_make_extension_kwargs,
    check_priority,
    not_an_extension_error,
)

# Re-exported for ppe.training.extension, PPE's path for it.
from ppe_core.training._protocols import ExtensionsManagerProtocol as ExtensionsManagerProtocol
from ppe_core.training._protocols import ManagerView
from ppe_core.training.triggers import get_trigger

if TYPE_CHECKING:
    from ppe_core.training.triggers import Trigger, TriggerLike

#: Priority of extensions that write the observation (e.g. evaluators); they run first.
PRIORITY_WRITER = 300
#: Priority of extensions that edit the observation another extension wrote.
PRIORITY_EDITOR = 200
#: Priority of extensions that only read the observation (logging, printing); the default.
PRIORITY_READER = 100
#: Priority of snapshot writers (PPE's value): they come last in the invocation order. That
#: they also run after every other trigger of the iteration was evaluated is the separate,
#: explicit :attr:`Extension.runs_last` flag, which snapshot extensions set.
PRIORITY_SNAPSHOT = -100

#: Anything the manager accepts as an extension: an :class:`Extension` or a plain callable
#: taking the manager.
ExtensionLike = Callable[["ManagerView"], object]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Keyword arguments of :func:`make_extension` beyond PPE's own, set as attributes.
_MAKE_EXTENSION_FLAGS = ("needs_model_state", "is_async", "runs_last")

# PPE reserves this name (Chainer's trainer used it); keeping the rule keeps names portable.
_RESERVED_NAMES = frozenset({"training"})


class Extension:
    """Base class of extensions: callables the manager runs when their trigger fires.

    An extension receives the manager after an iteration finished (``manager.iteration`` is
    already incremented). The class attributes are defaults that ``ExtensionsManager.extend``
    and :class:`ExtensionEntry` arguments override.

    Attributes:
        trigger: When to run; ``(1, 'iteration')`` (every iteration) by default.
        priority: Extensions due at the same iteration run in descending priority.
        name: Registered name; ``None`` until the manager assigns one.
        needs_model_state: Whether the extension reads model or optimizer state, so runtimes
            that defer work must make that state current before it runs.
        is_async: Whether the extension may run on a schedule decoupled from the model state.
        runs_last: Whether the extension runs only after every other due extension's trigger
            was consulted in its iteration, so that the trigger states it saves (a snapshot's)
            already account for that iteration. Snapshot extensions set it; PPE decided this
            by ``priority == PRIORITY_SNAPSHOT`` instead.
    """

    trigger: TriggerLike = (1, "iteration")
    priority: int = PRIORITY_READER
    name: str | None = None
    needs_model_state: bool = False
    is_async: bool = False
    runs_last: bool = False

    @property
    def default_name(self) -> str:
        """The name used when none is given: the class name unless a subclass overrides it."""
        return type(self).__name__

    def __call__(self, manager: ManagerView) -> object:
        """Runs the extension; called at the iterations its trigger accepts.

        Args:
            manager: The manager that owns the extension.
        """
        raise NotImplementedError(f"{type(self).__name__} must override __call__.")

    def initialize(self, manager: ManagerView) -> None:
        """Prepares the extension (and possibly the manager) before the first iteration.

        Called once, when the manager starts its extensions. An extension that restores
        state (a snapshot loader) does it here, so it runs before any trigger is consulted.

        Args:
            manager: The manager that owns the extension.
        """

    def finalize(self, manager: ManagerView) -> None:
        """Releases resources at the end of training (normal end or after an error).

        Args:
            manager: The manager that owns the extension.
        """

    def on_error(
        self, manager: ManagerView, exc: BaseException, tb: types.TracebackType | None
    ) -> None:
        """Reacts to an exception raised during training, before :meth:`finalize` runs.

        Args:
            manager: The manager that owns the extension.
            exc: The exception that stopped training; it is re-raised afterwards.
            tb: Its traceback.
        """

    def on_interrupt(self, manager: ManagerView) -> str | None:
        """Saves what a rerun resumes from when a SIGTERM/SIGINT stops training.

        Called on every rank at the iteration the ranks agreed to stop at, before
        :meth:`finalize`. The trainer's autoloading snapshot writes itself (unless this
        iteration's is already written) and returns its file name, which the exit line names;
        other extensions return ``None`` (the default).

        Args:
            manager: The manager that owns the extension.
        """
        return None

    def state_dict(self) -> dict[str, Any]:
        """Returns the state to store in a snapshot; nothing by default."""
        return {}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the state :meth:`state_dict` returned.

        Args:
            to_load: A dictionary produced by :meth:`state_dict`.
        """


# PPE's default name of a callable without a default_name attribute: its wrapper's class name.
_WRAPPED_DEFAULT_NAME = "_WrappedExtension"


class _WrappedExtension(Extension):
    """Adapts a plain callable (e.g. one decorated by :func:`make_extension`) to Extension.

    Every attribute the callable carries is honoured: the standard ones are copied at wrap
    time, and any other (``needs_sync``, ...) is forwarded on lookup.
    """

    def __init__(self, ext: ExtensionLike) -> None:
        self._ext = ext
        self.trigger = getattr(ext, "trigger", Extension.trigger)
        self.priority = getattr(ext, "priority", Extension.priority)
        for flag in _MAKE_EXTENSION_FLAGS:
            setattr(self, flag, bool(getattr(ext, flag, False)))
        # The callable's hooks where it has them (make_extension sets the first three), else
        # the base class's no-ops.
        for hook in ("initialize", "finalize", "on_error", "load_state_dict"):
            if hasattr(ext, hook):
                setattr(self, hook, getattr(ext, hook))
        # The callable's own ``name`` attribute (if any) is not the extension's name, as in
        # PPE: ``name`` stays the class's None until extend(name=...) or ``default_name``.

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes missing on the wrapper; guard against recursion while
        # the instance is half-built (copy, pickle).
        if name.startswith("__") or "_ext" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["_ext"], name)

    @property
    def default_name(self) -> str:
        """The callable's ``default_name`` (set by :func:`make_extension`), else PPE's name.

        PPE names every other callable (a plain function, a lambda, a callable object) after
        its wrapper class, ``_WrappedExtension``, not after the function; snapshots keep
        extension states by name, so ppe-core uses the same name for them to load either way.
        """
        name = getattr(self._ext, "default_name", None)
        return name if isinstance(name, str) and name else _WRAPPED_DEFAULT_NAME

    def __call__(self, manager: ManagerView) -> object:
        return self._ext(manager)

    def state_dict(self) -> dict[str, Any]:
        return dict(getattr(self._ext, "state_dict", dict)())


def _as_extension(ext: object) -> Extension:
    if isinstance(ext, Extension):
        return ext
    if not callable(ext) or (isinstance(ext, type) and issubclass(ext, Extension)):
        raise not_an_extension_error(ext)
    return _WrappedExtension(ext)


def _no_hook(*args: object) -> None:
    """The ``initialize``, ``finalize`` or ``on_error`` :func:`make_extension` sets when none
    is given."""


def make_extension(
    trigger: TriggerLike = None,
    default_name: str | None = None,
    priority: int | None = None,
    finalizer: Callable[[ManagerView], object] | None = None,
    initializer: Callable[[ManagerView], object] | None = None,
    on_error: Callable[[ManagerView, BaseException, types.TracebackType | None], object]
    | None = None,
    **kwargs: Any,
) -> Callable[[_F], _F]:
    """Decorator that turns a function of the manager into an extension.

    It only sets attributes on the function (``trigger``, ``default_name``, ``priority``,
    ``initialize``, ``finalize``, ``on_error``, as PPE does); the manager reads them when the
    function is registered. Beyond PPE's arguments it accepts ``needs_model_state=``,
    ``is_async=`` and ``runs_last=``, which the manager honours like the :class:`Extension`
    attributes.

    Args:
        trigger: Default trigger; ``(1, 'iteration')`` when None.
        default_name: Default name; the function's ``__name__`` when None.
        priority: Default priority; :data:`PRIORITY_READER` when None.
        finalizer: Called with the manager at the end of training; a no-op when None.
        initializer: Called with the manager before the first iteration; a no-op when None.
        on_error: Called with ``(manager, exc, tb)`` when training raises; a no-op when None.
        **kwargs: ``needs_model_state``, ``is_async`` and/or ``runs_last`` (booleans).

    Returns:
        The decorator, which returns the function itself.

    Raises:
        ArgumentTypeError: An unknown keyword argument (a ``TypeError``, as in PPE).

    Example::

        @make_extension(trigger=(1, "epoch"), needs_model_state=True)
        def log_norm(manager):
            ...
    """
    check_make_extension_kwargs(kwargs, _MAKE_EXTENSION_FLAGS)

    def decorator(ext: _F) -> _F:
        attributes: dict[str, Any] = {
            "trigger": Extension.trigger if trigger is None else trigger,
            "default_name": default_name or getattr(ext, "__name__", type(ext).__name__),
            "priority": Extension.priority if priority is None else priority,
            "finalize": _no_hook if finalizer is None else finalizer,
            "initialize": _no_hook if initializer is None else initializer,
            "on_error": _no_hook if on_error is None else on_error,
        }
        attributes.update(kwargs)
        for key, value in attributes.items():
            setattr(ext, key, value)
        return ext

    return decorator


class ExtensionEntry:
    """An extension with the options it was registered with.

    Options left as None are taken from the extension's own attributes.

    Args:
        extension: An :class:`Extension` or a callable taking the manager.
        name: Name to register under; the manager makes a taken name unique with a ``_N``
            suffix, as PPE does.
        priority: Invocation priority; higher runs first.
        trigger: When to run (anything ``get_trigger`` accepts).
        call_before_training: Whether to also run once before the first iteration.
    """

    def __init__(
        self,
        extension: ExtensionLike | Extension,
        *,
        name: str | None = None,
        priority: int | None = None,
        trigger: TriggerLike = None,
        call_before_training: bool = False,
    ) -> None:
        self.extension: Extension = _as_extension(extension)
        self.priority: int = check_priority(
            self.extension.priority if priority is None else priority
        )
        self.call_before_training = call_before_training
        self.trigger: Trigger = get_trigger(self.extension.trigger if trigger is None else trigger)
        self.set_name(
            name if name is not None else (self.extension.name or self.extension.default_name)
        )
        # The manager's schedule: the first iteration at which the trigger may fire, and
        # whether the manager calls the extension directly every step.
        self._due = -1
        self._every = False

    def set_trigger(self, trigger: TriggerLike) -> None:
        """Replaces the trigger (anything ``get_trigger`` accepts), e.g. ``extend(trigger=...)``."""
        self.trigger = get_trigger(trigger)

    def set_name(self, name: str) -> None:
        """Renames the entry and its extension (the manager makes taken names unique).

        Raises:
            ExtensionNameError: The name is empty or reserved (``"training"``).
        """
        # PPE takes any value as a name (a trigger tuple passed positionally as
        # extend(ext, (1, 'iteration')) becomes the name); keep that, as its text.
        name = str(name)
        if not name:
            raise ExtensionNameError(f"An extension name must be a non-empty string, got {name!r}.")
        if name in _RESERVED_NAMES:
            raise ExtensionNameError(
                f"The extension name {name!r} is reserved by the manager; pass another name=..."
            )
        self.name = name
        self.extension.name = name

    # PPE's private names, for code written against pytorch_pfn_extras' ExtensionEntry.
    _update_trigger = set_trigger
    _update_name = set_name

    @property
    def needs_model_state(self) -> bool:
        """Whether the extension declared that it reads model state."""
        return bool(getattr(self.extension, "needs_model_state", False))

    @property
    def runs_last(self) -> bool:
        """Whether the extension runs after every other trigger of its iteration was consulted."""
        return getattr(self.extension, "runs_last", False) is True

    def state_dict(self) -> dict[str, Any]:
        """Returns ``{'extension': ..., 'trigger': ...}``, the states of both parts."""
        return {"extension": self.extension.state_dict(), "trigger": self.trigger.state_dict()}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the parts :meth:`state_dict` saved; a missing or None part is skipped.

        Args:
            to_load: A dictionary produced by :meth:`state_dict`.
        """
        for part, owner in (("extension", self.extension), ("trigger", self.trigger)):
            if to_load.get(part) is not None:
                owner.load_state_dict(to_load[part])
