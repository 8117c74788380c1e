"""The compatibility layer: PPE 0.9's module paths and names, kept at the edge of the core.

PPE code imports ``pytorch_pfn_extras.training.triggers.interval_trigger.IntervalTrigger``;
ppe-core keeps that path, but the class lives in a private module (``triggers._interval``).
The modules that exist only to mirror such a path (the *shims*), the paths whose names a
package provides (the *faces*: ``training.extensions.log_report``, whose LogReport ships in
ppe-extensions) and the adapters that exist only for PPE code (``IgniteExtensionsManager``)
form this layer. Its rules, which tests/test_architecture.py checks against the tables below:

* A shim re-exports: its body is imports of the core modules its row names, ``__all__`` (the
  names it imports), and at most the ``__getattr__`` that says which PPE names are left out
  (``ppe_core._not_provided``). It defines nothing.
* A face forwards: its body is ``__all__``, the provider's imports for type checkers only, and
  the forwarding ``__getattr__`` of ``ppe_core._faces``. It imports no plugin at run time.
* The layer imports the core, never the reverse: no core module imports a module listed here.
  Only a package's ``__init__`` (the public namespace at PPE's path) names them, lazily, so
  that ``ppe.training.extensions.log_report`` is an attribute as in PPE.

The shims stay real files at PPE's paths (a finder generating them would cost nothing more at
``import ppe_core``, but type checkers and IDEs only see files: ``mypy`` must type-check a
script importing ``ppe_core.training.extensions.log_report.LogReport``). This module is a table
for the tests and for readers; nothing imports it at run time.
"""

from __future__ import annotations

__all__ = ["ADAPTERS", "FACES", "SHIMS"]

#: PPE path (a ppe_core module) -> the core modules it re-exports from.
SHIMS: dict[str, tuple[str, ...]] = {
    "ppe_core.dataloaders.utils": ("ppe_core.dataloaders._collate",),
    "ppe_core.nn.parallel.distributed": ("ppe_core.nn.parallel._distributed",),
    "ppe_core.runtime._map": ("ppe_core._map",),
    "ppe_core.training._manager_protocol": ("ppe_core.training._protocols",),
    "ppe_core.training.extension": (
        "ppe_core.errors",
        "ppe_core.training._extension",
        "ppe_core.training._protocols",
    ),
    "ppe_core.training.manager": (
        "ppe_core.errors",
        "ppe_core.training._ignite",
        "ppe_core.training._manager",
        "ppe_core.training._protocols",
    ),
    "ppe_core.training.trigger": (
        "ppe_core.training.triggers._base",
        "ppe_core.training.triggers._factory",
        "ppe_core.training.triggers._interval",
    ),
    "ppe_core.training.triggers.early_stopping_trigger": ("ppe_core.training.triggers._value",),
    "ppe_core.training.triggers.function_trigger": ("ppe_core.training.triggers._function",),
    "ppe_core.training.triggers.interval_trigger": ("ppe_core.training.triggers._interval",),
    "ppe_core.training.triggers.manual_schedule_trigger": ("ppe_core.training.triggers._interval",),
    "ppe_core.training.triggers.minmax_value_trigger": ("ppe_core.training.triggers._value",),
    "ppe_core.training.triggers.once_trigger": ("ppe_core.training.triggers._once",),
    "ppe_core.training.triggers.time_trigger": ("ppe_core.training.triggers._time",),
}

#: PPE path (a ppe_core module) -> the package that provides its names: a *face*, whose body
#: is ``__all__``, its provider's imports under ``if TYPE_CHECKING:`` (for type checkers) and,
#: at run time, ``ppe_core._faces.forward`` (or ``replace_with_provider``). The package maps
#: the path to its modules through the ``ppe_register_modules`` hook.
_STANDARD = "ppe-extensions"
FACES: dict[str, str] = {
    "ppe_core.training.extensions.accumulate._accumulate_base": _STANDARD,
    "ppe_core.training.extensions.accumulate.average_accumulate": _STANDARD,
    "ppe_core.training.extensions.accumulate.max_accumulate": _STANDARD,
    "ppe_core.training.extensions.accumulate.min_accumulate": _STANDARD,
    "ppe_core.training.extensions.accumulate.standard_deviation_accumulate": _STANDARD,
    "ppe_core.training.extensions.accumulate.unbiased_standard_deviation_accumulate": _STANDARD,
    "ppe_core.training.extensions.best_value": _STANDARD,
    "ppe_core.training.extensions.evaluator": _STANDARD,
    "ppe_core.training.extensions.fail_on_non_number": _STANDARD,
    "ppe_core.training.extensions.log_report": _STANDARD,
    "ppe_core.training.extensions.lr_scheduler": _STANDARD,
    "ppe_core.training.extensions.micro_average": _STANDARD,
    "ppe_core.training.extensions.parameter_statistics": _STANDARD,
    "ppe_core.training.extensions.plot_report": _STANDARD,
    "ppe_core.training.extensions.print_report": _STANDARD,
    "ppe_core.training.extensions.print_report_notebook": _STANDARD,
    "ppe_core.training.extensions.profile_report": _STANDARD,
    "ppe_core.training.extensions.progress_bar": _STANDARD,
    "ppe_core.training.extensions.progress_bar_notebook": _STANDARD,
    "ppe_core.training.extensions.slack": _STANDARD,
    "ppe_core.training.extensions.timeline_trace": _STANDARD,
    "ppe_core.training.extensions.util": _STANDARD,
    "ppe_core.training.extensions.value_observation": _STANDARD,
    "ppe_core.training.extensions.variable_statistics_plot": _STANDARD,
}

#: Modules that adapt the core for PPE code, with what they provide.
ADAPTERS: dict[str, str] = {
    "ppe_core.training._ignite": "IgniteExtensionsManager, the manager for pytorch-ignite loops",
}
