"""The PPE 0.9 names ppe-core does not provide, and the errors that say so.

One table, :data:`NOT_PROVIDED`, drives three things: the ``__getattr__`` of ``ppe_core`` and of
the modules that mirror a PPE path (``ppe.cuda``, ``ppe.nn.modules``,
``ppe.training.manager.record`` raise :class:`~ppe_core.errors.NotProvidedError`, an
``AttributeError``, so ``hasattr`` stays False for feature detection); a finder at the end of
``sys.meta_path`` (``import ppe_core.cuda``, ``from ppe_core.utils import checkpoint`` raise
:class:`~ppe_core.errors.NotProvidedModuleError`, a ``ModuleNotFoundError``); and the "Names not
provided" table of docs/migration.md, which tests/test_compat_names.py checks row for row.

The finder is consulted only for imports no other finder resolved, and it is one dict lookup,
so it costs nothing on successful imports. This module imports nothing but ``ppe_core.errors``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import NoReturn

from ppe_core.errors import NotProvidedError, NotProvidedModuleError

__all__ = ["NOT_PROVIDED", "install_finder", "message", "module_getattr", "not_provided_error"]

_INTEROP = "tensor/array interop with NumPy and CuPy, outside ppe-core's training scope"
_CUDA = (
    "CUDA stream and CuPy memory-pool helpers; ppe-core makes no device calls outside its "
    "runtime plugins (ppe-cuda)"
)
_DATASET = "dataset utilities, outside ppe-core's training scope"
_OPS = "custom-operator registration (the `ppe` torch.library namespace), outside ppe-core's scope"
_ONNX = "ONNX export helpers, outside ppe-core's training scope"
_COMPARER = "PPE's tools comparing two engines' outputs, outside ppe-core's training scope"
_JIT = "TorchScript graph-pass helpers built on torch._C, outside ppe-core's training scope"
_OPTUNA = "PPE's Optuna helpers for `ppe.config`, outside ppe-core's training scope"
_NN_MODULES = "PPE's implementation package of `ppe.nn`"
_USE_NN = "import the same names from `ppe.nn`"
_EXPORT = "use `torch.onnx.export`"

#: PPE path below ``pytorch_pfn_extras`` -> (what it is and why it is missing, what to use).
#: A row of docs/migration.md's table reads ``| `path` | why; instead |`` (``.name`` at the top).
NOT_PROVIDED: dict[str, tuple[str, str]] = {
    # Top level ----------------------------------------------------------------------------
    "as_ndarray": (_INTEROP, "`tensor.numpy()` on CPU, or `cupy.from_dlpack(tensor)`"),
    "as_numpy_dtype": (_INTEROP, "`torch.empty(0, dtype=dtype).numpy().dtype`"),
    "from_ndarray": (_INTEROP, "`torch.from_numpy(array)` or `torch.from_dlpack(array)`"),
    "from_numpy_dtype": (_INTEROP, "`torch.from_numpy(numpy.empty(0, dtype)).dtype`"),
    "get_xp": (_INTEROP, "`numpy`, or `cupy` when `tensor.device.type == 'cuda'`"),
    # cuda ---------------------------------------------------------------------------------
    "cuda": (_CUDA, "`torch.cuda` (streams) and `cupy.cuda` (allocators)"),
    "cuda.stream": (_CUDA, "`torch.cuda.stream(stream)`, plus `cupy.cuda.ExternalStream` for CuPy"),
    "cuda.use_default_mempool_in_cupy": (
        _CUDA,
        "`cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)`",
    ),
    "cuda.use_torch_mempool_in_cupy": (
        _CUDA,
        "`cupy.cuda.set_allocator(...)` with an allocator calling "
        "`torch.cuda.caching_allocator_alloc`",
    ),
    # config_types -------------------------------------------------------------------------
    "config_types": (
        _OPTUNA,
        "pass the trial's methods as types: `ppe.config.Config(tree, "
        "types={'optuna_suggest_float': trial.suggest_float, ...})`",
    ),
    "config_types.optuna_types": (
        _OPTUNA,
        "a dict of the trial's `suggest_*` methods, passed in `types=` of `ppe.config.Config`",
    ),
    "config_types.load_path_with_optuna_types": (
        _OPTUNA,
        "`ppe.config.Config.load_path(path, types={**types, 'optuna_suggest_float': "
        "trial.suggest_float, ...})`",
    ),
    # dataset ------------------------------------------------------------------------------
    "dataset": (_DATASET, "`torch.utils.data` datasets"),
    "dataset.ItemNotFoundException": (_DATASET, "no replacement in torch"),
    "dataset.SharedDataset": (_DATASET, "a `torch.utils.data.Dataset` caching its items yourself"),
    "dataset.TabularDataset": (_DATASET, "`torch.utils.data.Dataset`"),
    "dataset.shared_dataset": (_DATASET, "`torch.utils.data.Dataset`"),
    "dataset.tabular": (_DATASET, "`torch.utils.data.Dataset`"),
    "dataset.shared_dataset.Cache": (_DATASET, "no replacement in torch"),
    "dataset.shared_dataset.InfiniteCache": (_DATASET, "no replacement in torch"),
    "dataset.shared_dataset.ItemNotFoundException": (_DATASET, "no replacement in torch"),
    "dataset.shared_dataset.SharedDataset": (
        _DATASET,
        "a `torch.utils.data.Dataset` caching its items yourself",
    ),
    "dataset.tabular.DelegateDataset": (_DATASET, "`torch.utils.data.Dataset`"),
    "dataset.tabular.from_data": (_DATASET, "`torch.utils.data.TensorDataset`"),
    "dataset.tabular.delegate_dataset": (_DATASET, "`torch.utils.data.Dataset`"),
    "dataset.tabular.tabular_dataset": (_DATASET, "`torch.utils.data.Dataset`"),
    # ops ----------------------------------------------------------------------------------
    "ops": (_OPS, "`torch.library.custom_op`"),
    "ops.OpDesc": (_OPS, "`torch.library.custom_op` with `register_autograd`"),
    "ops.register": (_OPS, "`torch.library.custom_op`"),
    "ops.register.OpDesc": (_OPS, "`torch.library.custom_op` with `register_autograd`"),
    "ops.register.register": (_OPS, "`torch.library.custom_op`"),
    "ops.register.library": (_OPS, "`torch.library.Library` of your own namespace"),
    "ops.register.library_impl": (_OPS, "`torch.library.Library` of your own namespace"),
    "ops.register.library_autograd_impl": (_OPS, "`torch.library.Library` of your own namespace"),
    "ops.register.library_meta_impl": (_OPS, "`torch.library.Library` of your own namespace"),
    # onnx (the names after `available` exist in PPE only when the onnx package imports) ---
    "onnx": (_ONNX, _EXPORT),
    "onnx.available": (_ONNX, "`importlib.util.find_spec('onnx') is not None`"),
    "onnx.export": (_ONNX, _EXPORT),
    "onnx.export_testcase": (_ONNX, _EXPORT),
    "onnx.is_large_tensor": (_ONNX, "`tensor.numel() * tensor.element_size()` against your limit"),
    "onnx.LARGE_TENSOR_DATA_THRESHOLD": (_ONNX, "a threshold of your own"),
    "onnx.annotate": (_ONNX, _EXPORT),
    "onnx.apply_annotation": (_ONNX, _EXPORT),
    "onnx.scoped_anchor": (_ONNX, _EXPORT),
    "onnx.as_output": (_ONNX, _EXPORT),
    "onnx.grad": (_ONNX, _EXPORT),
    "onnx.load_model": (_ONNX, "`onnx.load`"),
    "onnx.no_grad": (_ONNX, "`torch.no_grad`"),
    "onnx.lax": (_ONNX, _EXPORT),
    # torchscript --------------------------------------------------------------------------
    "torchscript": (_JIT, "`torch.jit`"),
    "torchscript.find_inplace": (_JIT, "scan `graph.nodes()` for kinds ending in `_`"),
    "torchscript.run_jit_pass": (_JIT, "call the pass, then `torch._C._jit_pass_lint(graph)`"),
    # utils --------------------------------------------------------------------------------
    "utils": (
        "PPE's checkpointing and comparer utilities",
        "`torch.utils.checkpoint` and `torch.testing.assert_close`",
    ),
    "utils.checkpoint": (
        "PPE's activation checkpointing",
        "`torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)` (PPE's also "
        "stops batch norm updating its running statistics twice)",
    ),
    "utils.checkpoint.checkpoint": (
        "PPE's activation checkpointing",
        "`torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)` (PPE's also "
        "stops batch norm updating its running statistics twice)",
    ),
    "utils.comparer": (_COMPARER, "`torch.testing.assert_close` on both runs' outputs"),
    "utils.comparer.Comparer": (_COMPARER, "`torch.testing.assert_close` on both runs' outputs"),
    "utils.comparer.ModelComparer": (_COMPARER, "`torch.testing.assert_close` on the state dicts"),
    "utils.comparer.OutputsComparer": (_COMPARER, "`torch.testing.assert_close` on the outputs"),
    "utils.comparer.get_default_comparer": (_COMPARER, "`torch.testing.assert_close`"),
    "utils.comparer.intermediate_value": (_COMPARER, "return or record the value yourself"),
    # engine: imports inside PPE's module, not engine API ----------------------------------
    "engine.StateObjectProtocol": (
        "an import inside PPE's engine module, not engine API",
        "`ppe.training.manager.StateObjectProtocol`",
    ),
    "engine.runtime_registry": (
        "an import inside PPE's engine module, not engine API",
        "`ppe.runtime.runtime_registry`",
    ),
    # nn.parallel.distributed: PPE internals visible as module globals -----------------------
    "nn.parallel.distributed.foreach_wrapper": (
        "the lazily made instance of PPE's `torch._foreach` helper for its own all-reduce; "
        "ppe-core's `DistributedDataParallel` is PyTorch's (bucketed all-reduce)",
        "nothing to replace; `torch._foreach_mul` and `torch._foreach_add_` do the same scaling",
    ),
    "nn.parallel.distributed.get_foreach_wrapper": (
        "the getter of PPE's `torch._foreach` helper for its own all-reduce; ppe-core's "
        "`DistributedDataParallel` is PyTorch's (bucketed all-reduce)",
        "nothing to replace; `torch._foreach_mul` and `torch._foreach_add_` do the same scaling",
    ),
    "nn.parallel.distributed.logger": (
        "PPE's module logger",
        "`logging.getLogger('torch.nn.parallel.distributed')`, the module that does the work",
    ),
    "nn.parallel.distributed.record": (
        "an import inside PPE's module, not its API",
        "`ppe.profiler.record`",
    ),
    # nn.modules ---------------------------------------------------------------------------
    "nn.modules": (_NN_MODULES, _USE_NN),
    "nn.modules.ensure_shape": (_NN_MODULES, "`ppe.nn.ensure` and `ppe.nn.Ensure`"),
    "nn.modules.extended_sequential": (_NN_MODULES, "`ppe.nn.ExtendedSequential`"),
    "nn.modules.lazy": (_NN_MODULES, "the lazy layers in `ppe.nn`"),
    "nn.modules.lazy_batchnorm": (_NN_MODULES, "`ppe.nn.LazyBatchNorm1d/2d/3d`"),
    "nn.modules.lazy_conv": (_NN_MODULES, "`ppe.nn.LazyConv1d/2d/3d`"),
    "nn.modules.lazy_linear": (_NN_MODULES, "`ppe.nn.LazyLinear`"),
    # training: PPE internals visible as module globals -------------------------------------
    "training.manager.record": (
        "an import inside PPE's manager module, not manager API",
        "`ppe.profiler.record`",
    ),
    "training.trigger._never_fire_trigger": ("a private helper of PPE", "`get_trigger(None)`"),
    "training.extensions.evaluator.IterationStatus": (
        "an internal helper of PPE's evaluation progress bar",
        "nothing to replace",
    ),
    "training.extensions.variable_statistics_plot.matplotlib": (
        "PPE's lazily filled module global",
        "`import matplotlib` yourself",
    ),
    "training.extensions.variable_statistics_plot.matplotlib_savefun": (
        "PPE's pyplot save helper",
        "nothing; ppe-core draws on a `matplotlib.figure.Figure` without pyplot",
    ),
    "training.extensions.variable_statistics_plot.percentile": (
        "PPE's internal helper",
        "`numpy.percentile` or `Statistician(...)(x)['percentile']`",
    ),
    "training.extensions.log_report.LogWriterSaveFunc": (
        "PPE's savefun class for log files",
        "`LogReport(format=..., append=...)` picks the serializer, and a custom writer receives "
        "it as `savefun`",
    ),
    "training.extensions.log_report.Observation": (
        "PPE's type alias (`Dict[str, Any]`)",
        "`dict[str, Any]`",
    ),
    "training.extensions.plot_report.matplotlib_savefun": (
        "PPE's pyplot save helper",
        "nothing; ppe-core draws on a `matplotlib.figure.Figure` without pyplot",
    ),
    "training.extensions.print_report.create_header_and_templates": (
        "PPE's internal table helper (used by its notebook variant)",
        "`PrintReport`, which builds the same table",
    ),
    "training.extensions.print_report.filter_and_sort_entries": (
        "PPE's internal helper",
        "`PrintReport(entries=None)`, which orders the keys the same way",
    ),
}


def message(path: str) -> str:
    """The error message for the PPE name ``path`` (relative to ``pytorch_pfn_extras``)."""
    why, instead = NOT_PROVIDED[path]
    return (
        f"ppe_core.{path} is not provided (pytorch_pfn_extras.{path}: {why}). Instead: "
        f"{instead}; or install pytorch-pfn-extras beside ppe-core and use "
        f"pytorch_pfn_extras.{path} from there. See docs/migration.md, 'Names not provided'."
    )


def not_provided_error(module: str, name: str) -> AttributeError:
    """The error for ``module.name`` missing: a :class:`NotProvidedError` for a PPE name that
    ppe-core leaves out on purpose, else Python's plain ``AttributeError`` message."""
    prefix = module.partition(".")[2]
    path = f"{prefix}.{name}" if prefix else name
    if module.split(".", 1)[0] == "ppe_core" and path in NOT_PROVIDED:
        return NotProvidedError(message(path), name=name)
    return AttributeError(f"module {module!r} has no attribute {name!r}")


def module_getattr(module: str) -> Callable[[str], NoReturn]:
    """A module-level ``__getattr__`` for ``module`` that only raises :func:`not_provided_error`.

    Assign it under ``if not TYPE_CHECKING:`` so type checkers still flag unknown names.
    """

    def __getattr__(name: str) -> NoReturn:
        raise not_provided_error(module, name)

    return __getattr__


class _NotProvidedFinder:
    """Last finder on ``sys.meta_path``: an import of a ppe_core path that no other finder found
    and that names a PPE module or name ppe-core leaves out raises the table's message."""

    @staticmethod
    def find_spec(
        fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        package, _, rest = fullname.partition(".")
        if package == "ppe_core" and rest in NOT_PROVIDED:
            # ``name`` is the PPE module, not ``fullname``: ``from ppe_core import cuda`` drops a
            # ModuleNotFoundError whose name is the submodule it tried, hiding this message.
            raise NotProvidedModuleError(message(rest), name=f"pytorch_pfn_extras.{rest}")
        return None


def install_finder() -> None:
    """Append the finder to ``sys.meta_path`` once (idempotent, e.g. across reloads)."""
    if not any(type(finder).__name__ == "_NotProvidedFinder" for finder in sys.meta_path):
        sys.meta_path.append(_NotProvidedFinder())
