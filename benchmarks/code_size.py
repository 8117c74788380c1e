"""Code size of ppe-core's training, runtime, handler and reporting parts beside PPE 0.9's.

    .venv/bin/python -m benchmarks.code_size

What is counted, per file: ``lines`` (physical lines), ``code`` (lines holding a token that is
not a comment, a docstring or layout: blank lines, comment lines and docstring lines drop out;
a line is counted once however many tokens it holds, and a multi-line string that is not a
docstring counts every line it spans) and ``logical`` (logical lines as Python's tokenizer ends
them, without docstring statements: independent of how a formatter wraps long lines). A
docstring is a statement that is only a string literal: the module's, a class's or a
function's, and an attribute docstring after an assignment. Source is read with ``tokenize``
and ``ast`` (stdlib only; neither ppe-core nor PPE is imported).

The parts: ``ppe_core/training/**``, ``runtime/**``, ``handler/**``, ``reporting.py`` and the
top-level modules those parts are built from (:data:`EXTRA_MODULES`); PPE 0.9's
``training/**``, ``runtime/**``, ``handler/**``, ``reporting.py`` and ``_scalar.py`` (the
arithmetic its reporting uses, :data:`PPE_EXTRA_MODULES`), located with
``importlib`` (skipped with a message when pytorch-pfn-extras is not installed). Every counted
ppe-core file is classified in :data:`FILES` as ``same`` (behaviour PPE has), ``beyond-ppe``
(behaviour PPE 0.9 does not have, with the reason) or ``compat`` (PPE's module paths and
aliases that only re-export); every other ppe-core file is in :data:`NOT_COUNTED` with the
reason. A file that does something PPE does, even with extras (typed runtime options beside
PPE's autocast options, retention that skips invalid snapshots beside PPE's ``n_retains``),
is ``same``; ``beyond-ppe`` holds files with no counterpart in PPE 0.9. Whole files err both
ways (a beyond-ppe file may hold PPE's behaviour too), which the definitions counted apart
below correct. A file
in neither table (or a table row without its file) is an error: a new module cannot go
uncounted. The "Not counted" table ends with its total, so code moved out of the compared
parts (into ``writing/``, say) stays in sight.

Whole definitions can be counted apart from their file's class, in both directions and on
both sides (``benchmarks/code_size_symbols.json``, :data:`SYMBOLS_FILE`): a function, method,
class or module-level assignment of a ``same`` file whose whole behaviour PPE 0.9 lacks
(``beyond-ppe``), one of a ``beyond-ppe`` file whose behaviour PPE has (``same``), and one of
PPE's files whose behaviour ppe-core does not provide (``not-provided``: left out of PPE's
side, as ppe-core's compat code is left out of its). Each entry names what PPE does instead.
A definition spans its decorators to its last line; entries of one file must not overlap,
must name an existing definition and must move it to another class.

Lines outside a definition that exist only for definitions of the other class follow them
(:func:`followers`): in a same file, an import of beyond-ppe names (whatever uses them reaches
for behaviour PPE lacks) and a statement that only calls a beyond-ppe function (a check, a
record of ppe-core's own state); in either class, an import whose names are used only inside
the file's definitions counted in the other class, and an ``__all__`` entry exporting only
definitions of the other class. A name's class is its definition's, followed through the
imports of the counted files; names from elsewhere (``errors.py``, torch) have none and keep
their lines where they are. PPE's imports used only inside its not-provided definitions leave
its side the same way (:func:`ppe_left_out_imports`). The report prints the file tables whole,
then every entry with its count, the followers, then the parts and totals with the split
beside the files-whole count. Results and what they mean: docs/architecture.md ("Size").
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import io
import json
import sys
import tokenize
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The repository root (this file is ``benchmarks/code_size.py``).
ROOT = Path(__file__).resolve().parent.parent
_THIS_FILE = "benchmarks/code_size.py"  # named in messages (``__name__`` is "__main__" there)

SAME = "same"
BEYOND = "beyond-ppe"
COMPAT = "compat"
#: The classes, in the order their tables are printed, with what each means.
NOT_PROVIDED = "not-provided"
CLASSES: dict[str, str] = {
    SAME: "behaviour PPE 0.9 has (some files with extras beside it)",
    BEYOND: "behaviour with no counterpart in PPE 0.9",
    COMPAT: "PPE's module paths and aliases that only re-export",
}

#: The directories whose every ``.py`` file is counted (relative to the repository root).
PART_DIRS = ("ppe_core/training", "ppe_core/runtime", "ppe_core/handler")
#: Top-level modules that belong to those parts, with the part each belongs to.
EXTRA_MODULES: dict[str, str] = {
    "ppe_core/reporting.py": "reporting",
    "ppe_core/_reporting.py": "reporting",
    "ppe_core/_reporting_checks.py": "reporting",
    "ppe_core/_summary_exact.py": "reporting",
    "ppe_core/_resolve.py": "runtime",
    "ppe_core/_registry.py": "runtime",
    "ppe_core/_map.py": "runtime",
    "ppe_core/_registrations.py": "runtime",
    "ppe_core/_active_host.py": "training",
}
#: PPE's parts, relative to the ``pytorch_pfn_extras`` package directory.
PPE_PART_DIRS = ("training", "runtime", "handler")
#: PPE's top-level modules that belong to those parts: ``_scalar.py`` holds the arithmetic its
#: reporting and training use (``divide_scalar``, ...), which ppe-core keeps in ``_reporting.py``.
PPE_EXTRA_MODULES: dict[str, str] = {"reporting.py": "reporting", "_scalar.py": "reporting"}

_T = "ppe_core/training/"
_E = "ppe_core/training/extensions/"
_TR = "ppe_core/training/triggers/"

#: Every counted ppe-core file -> (class, why). Paths are relative to the repository root.
FILES: dict[str, tuple[str, str]] = {
    # reporting
    "ppe_core/reporting.py": (SAME, "the public face at PPE's path (PPE's holds the code)"),
    "ppe_core/_reporting.py": (SAME, "Reporter, report, Summary, DictSummary"),
    "ppe_core/_reporting_checks.py": (
        BEYOND,
        "reporting's explained errors: an unregistered observer, no current reporter, the mean "
        "of nothing, a non-number or a tensor of several elements added to a Summary, a "
        "malformed (value, weight) entry (PPE: a bare KeyError, IndexError, ZeroDivisionError "
        "or ValueError, or the arithmetic's error or a vector mean)",
    ),
    "ppe_core/_summary_exact.py": (
        BEYOND,
        "a Summary's unmerged accumulators beside PPE's sums in its snapshot state: a resumed "
        "run sums bit for bit like an uninterrupted one (PPE saves the merged sums only, and a "
        "resumed run rounds differently)",
    ),
    # runtime
    "ppe_core/_resolve.py": (SAME, "runtime resolution with the active registry (ppe.to's)"),
    "ppe_core/_registry.py": (
        SAME,
        "the registry base (PPE: runtime/_registry.py): register, look up, unregister",
    ),
    "ppe_core/_map.py": (SAME, "ppe.map (PPE's runtime/_map.py)"),
    "ppe_core/_registrations.py": (
        BEYOND,
        "who registered what (plugins, lazy targets, replaced entries), first-party names kept "
        "from other plugins, duplicates and failed lookups explained (PPE: a plain dict)",
    ),
    "ppe_core/runtime/__init__.py": (SAME, "the runtime namespace"),
    "ppe_core/runtime/_device.py": (
        SAME,
        "DeviceRuntime: device, autocast and grad scaler as PPE's PyTorchRuntime, plus the "
        "options device plugins share applied where modules move and batches convert",
    ),
    "ppe_core/runtime/_execute.py": (SAME, "code blocks and their execution"),
    "ppe_core/runtime/_map.py": (COMPAT, "PPE's path of ppe.map"),
    "ppe_core/runtime/_device_types.py": (
        BEYOND,
        "device types beyond PyTorch's own: the torch device a DeviceRuntime's spec moves to, "
        "specs of another type refused, the device type autocast runs on checked (PPE: "
        "torch.device and torch.autocast as they are, their errors left to PyTorch)",
    ),
    "ppe_core/runtime/_shared_options.py": (
        BEYOND,
        "the options device plugins share that PPE's runtimes lack: autocast over a module's "
        "forward (a dtype alone, the device's default dtype, both checked), channels_last, "
        "compile in place, non-blocking copies, and their typed specs (PPE: autocast and "
        "grad_scaler for code blocks, the dict passed to torch.autocast as it is)",
    ),
    "ppe_core/runtime/_option_specs.py": (
        BEYOND,
        "OptionSpec/RuntimeOptions: typed, declared, validated runtime options (PPE: an untyped "
        "dict)",
    ),
    "ppe_core/runtime/_registry.py": (SAME, "RuntimeRegistry"),
    "ppe_core/runtime/_runtime_checks.py": (
        BEYOND,
        "the runtime layer's checks PPE lacks: a device neither a non-empty str nor a "
        "torch.device, an unknown device type's hint, runtimes registered as instances or for "
        "a device, a runtime_class or grad_scaler of another type, an autocast option of "
        "another type, a device spec torch.device refuses, code-block outputs with nothing to "
        "backpropagate, ppe.map's out_keys on a non-dict (PPE: Python's or torch's error, or "
        "no backward in silence)",
    ),
    "ppe_core/runtime/_runtime.py": (
        SAME,
        "BaseRuntime, PyTorchRuntime (its autocast arguments: PPE's runtime/_autocast.py), "
        "module tagging",
    ),
    "ppe_core/runtime/_to.py": (SAME, "ppe.to"),
    # handler
    "ppe_core/handler/__init__.py": (SAME, "the handler namespace"),
    "ppe_core/handler/_code_block.py": (SAME, "CodeBlockLogic, forward, update_parameters"),
    "ppe_core/handler/_handler.py": (SAME, "BaseHandler, Handler"),
    "ppe_core/handler/_diagnostics.py": (
        BEYOND,
        "explained user errors PPE leaves to PyTorch or lets pass: a batch that does not fit "
        "forward or the model's dtype, a first step that trains nothing, a backward output "
        "that is missing, has no graph or is not a scalar (PPE: a bare warning, silence, "
        "torch's error), Logic and Handler options of the wrong type, autocast on a device "
        "type without it, an unknown model or optimizer name, an optimizer holding none of the "
        "models' parameters, report keys the outputs lack (PPE: a bare KeyError)",
    ),
    "ppe_core/handler/_accumulation.py": (
        BEYOND,
        "gradient accumulation (grad_accumulation_steps): windows cut at the epoch's end, "
        "losses divided by the window, DDP/FSDP2's gradient sync skipped inside it (PPE has "
        "no accumulation)",
    ),
    "ppe_core/handler/_grad_scalers.py": (
        BEYOND,
        "grad scalers: the runtime's scaler adopted by the Logic, every scaler's state saved "
        "with the handler (PPE: the Logic's grad_scaler option; its state reaches snapshots "
        "only as create_trainer's options state object, which _resume.py mirrors)",
    ),
    "ppe_core/handler/_logic.py": (SAME, "BaseLogic, Logic, ClousureLogic"),
    "ppe_core/handler/_optimizer_targets.py": (
        BEYOND,
        "several optimizers per model: each one's model, loss and grad scaler, and the "
        "Logic's staged step; the optimizers CodeBlockLogic steps, those holding its model's "
        "parameters or named (PPE: every optimizer of the trainer)",
    ),
    # training: the engine
    "ppe_core/_active_host.py": (
        BEYOND,
        "how the Trainer/Evaluator reach the plugin host (setup/teardown hooks)",
    ),
    _T + "__init__.py": (SAME, "the training namespace"),
    _T + "_eval_progress.py": (
        BEYOND,
        "the Evaluator's progress bar off a terminal: one plain summary line per pass in logs "
        "and pipes (PPE draws its terminal bar, control codes included, everywhere)",
    ),
    _T + "_evaluator.py": (SAME, "Evaluator, DistributedEvaluator"),
    _T + "_extension.py": (SAME, "Extension, ExtensionEntry, make_extension"),
    _T + "_handler_failures.py": (
        BEYOND,
        "every extension's on_error and finalize runs even when one raises, failures warned "
        "while an error is handled (PPE: the first failure propagates, the rest do not run)",
    ),
    _T + "_ignite.py": (SAME, "IgniteExtensionsManager (in PPE's manager.py)"),
    _T + "_manager.py": (
        SAME,
        "ExtensionsManager: extensions on their triggers by priority, the stop trigger, "
        "state_dict and load_state_dict (PPE's layout)",
    ),
    _T + "_manager_checks.py": (
        BEYOND,
        "the manager's checks PPE lacks: models in a dict, a non-integer iters_per_epoch, a "
        "negative max_epochs, writer, state objects, extensions and priorities, "
        "step_optimizers names, extend()'s ignored keyword arguments, make_extension's, the "
        "ignite package, a Trainer's manager arguments, max_epochs and optimizer names, loaded "
        "states without an extension's entry (PPE: a TypeError when run() starts, a KeyError, "
        "silence); the errors PPE also raises are counted same in code_size_symbols.json",
    ),
    _T + "_manager_protocol.py": (COMPAT, "PPE's path of the manager protocols"),
    _T + "_metric_checks.py": (
        BEYOND,
        "evaluators' metrics, and a Trainer's evaluators, checked where given (PPE fails at the "
        "first batch), and the extension Evaluator's two-argument metrics told from PPE's "
        "three-argument ones; AccuracyMetric's inputs explained (a missing key, no labels, "
        "element counts that differ)",
    ),
    _T + "_protocols.py": (SAME, "the manager protocols"),
    _T + "_ranks.py": (
        BEYOND,
        "ranks agree at start which extensions issue collectives, and a distributed "
        "evaluation's reported keys before its means are reduced (no hang on mismatch), its "
        "collective timeouts explained",
    ),
    _T + "_resume.py": (
        BEYOND,
        "bit-exact resume: RNG states and epoch order, per rank, verified on load (a changed "
        "epoch length warns), kept under the state's '_ppe_core' key; ResumeStateHost, where "
        "a trainer registers them",
    ),
    _T + "_run_lock.py": (BEYOND, "run lock: one live run per output directory"),
    _T + "_sample_means.py": (
        BEYOND,
        "evaluation means over samples: each batch weighted by its number of samples (PPE "
        "averages batches, a smaller last batch as much as a full one)",
    ),
    _T + "_state.py": (
        BEYOND,
        "the key of ppe-core's own resume data in a state dict (PPE has none; it ignores the key)",
    ),
    _T + "_state_mismatch.py": (
        BEYOND,
        "a state that lacks an entry or does not fit a model or optimizer explained, checked "
        "before anything loads: its name, missing and unexpected keys, a data-parallel prefix, "
        "another optimizer type (PPE: a bare KeyError, torch's error)",
    ),
    _T + "_stop_reason.py": (BEYOND, "why training ended: stop_reason (PPE only stops)"),
    _T + "_epoch_length.py": (
        BEYOND,
        "epochs of unknown length (loaders without len()), read ahead, the manager's length "
        "learnt then; each epoch's end and a loaded state's length checked against it, pass "
        "lengths checked (PPE ends a short epoch in silence, takes len(loader) unchecked)",
    ),
    _T + "_trainer.py": (SAME, "Trainer"),
    _T + "_trigger_util.py": (COMPAT, "PPE's private path of the trigger type aliases"),
    _T + "extension.py": (COMPAT, "PPE's path of Extension"),
    _T + "manager.py": (COMPAT, "PPE's path of the managers"),
    _T + "metrics.py": (SAME, "AccuracyMetric"),
    _T + "trigger.py": (COMPAT, "PPE's path of get_trigger"),
    # training: extensions
    _E + "__init__.py": (SAME, "the extensions namespace"),
    _E + "_accumulate.py": (SAME, "the accumulate extensions"),
    _E + "_best_value.py": (SAME, "BestValue, MaxValue, MinValue"),
    _E + "_console.py": (SAME, "terminal and notebook checks of the progress bars and PrintReport"),
    _E + "_evaluator.py": (SAME, "the extension-style evaluators"),
    _E + "_fail_on_non_number.py": (SAME, "FailOnNonNumber"),
    _E + "_keys.py": (
        BEYOND,
        "observation-key arguments checked: a bare string refused (PPE tracks its characters)",
    ),
    _E + "_log_report.py": (SAME, "LogReport"),
    _E + "_log_formats.py": (
        BEYOND,
        "LogReport's files: CSV, entries appended (JSON array extended in place) instead of "
        "the whole file rewritten per entry, number templates byte for byte json.dumps' and "
        "yaml.safe_dump's, a torn last entry dropped on reading (PPE: json.dumps/yaml of the "
        "whole log per entry, no CSV, no reading back)",
    ),
    _E + "_log_reader.py": (
        SAME,
        "finding the LogReport and a new-entries trigger, for PrintReport (PPE: inline)",
    ),
    _E + "_lr_scheduler.py": (SAME, "LRScheduler"),
    _E + "_micro_average.py": (SAME, "MicroAverage"),
    _E + "_parameter_statistics.py": (SAME, "ParameterStatistics"),
    _E + "_plot_report.py": (SAME, "PlotReport"),
    _E + "_print_report.py": (SAME, "PrintReport"),
    _E + "_profile_report.py": (SAME, "ProfileReport"),
    _E + "_progress_bar.py": (SAME, "ProgressBar"),
    _E + "_progress_plain.py": (
        BEYOND,
        "ProgressBar off a terminal: plain, rate-limited lines for logs (min_interval); nothing "
        "off rank 0 (PPE writes terminal control codes everywhere, on every rank)",
    ),
    _E + "_slack.py": (SAME, "Slack, SlackWebhook"),
    _E + "_snapshot.py": (SAME, "snapshot, snapshot_object, SnapshotMode: choosing the mode"),
    _E + "_snapshot_base.py": (
        SAME,
        "the snapshot extension (SnapshotMode.DEFAULT: autoload, n_retains, writers)",
    ),
    _E + "_snapshot_modes.py": (SAME, "SnapshotMode.DISTRIBUTED and SHARDED"),
    _E + "_snapshot_candidates.py": (
        BEYOND,
        "which snapshot files are trusted: links out of the directory refused, manifests read, "
        "ppe-core's files whose manifest a kill prevented (PPE: the newest matching file)",
    ),
    _E + "_snapshot_checks.py": (
        BEYOND,
        "snapshot arguments and the filename template checked before training (PPE fails at "
        "the first save)",
    ),
    _E + "_snapshot_host_copy.py": (
        BEYOND,
        "a background snapshot's state copied to host memory first, large buffers refilled "
        "(PPE's background writers save the live tensors)",
    ),
    _E + "_snapshot_manifest.py": (
        BEYOND,
        "snapshot manifests: size and SHA-256 verified before loading, safe unpickling "
        "(PPE: a bare torch.load)",
    ),
    _E + "_snapshot_ranks.py": (
        BEYOND,
        "snapshots under torch.distributed: every rank's resume data gathered, autoload's "
        "choice compared across ranks, only when every rank has the snapshot (PPE: neither)",
    ),
    _E + "_snapshot_retention.py": (
        SAME,
        "autoload's newest snapshot and n_retains (in PPE's _snapshot.py), plus: invalid "
        "snapshots skipped, only complete ones counted",
    ),
    _E + "_snapshot_sharding.py": (BEYOND, "sharded (DTensor) state found and refused or kept"),
    _E + "_snapshot_dcp.py": (
        BEYOND,
        "SnapshotMode.DCP: asynchronous, verified, resharding snapshots on "
        "torch.distributed.checkpoint",
    ),
    _E + "_snapshot_dcp_mode.py": (
        BEYOND,
        "SnapshotMode.DCP's extension class (its files are _snapshot_dcp.py's)",
    ),
    _E + "_tensorboard.py": (BEYOND, "a TensorBoard extension (PPE has only the writer)"),
    _E + "_throughput.py": (BEYOND, "Throughput: samples per second, FLOPs and MFU"),
    _E + "_timeline_trace.py": (SAME, "TimelineTrace"),
    _E + "_value_observation.py": (SAME, "observe_value, observe_lr"),
    _E + "_variable_statistics_plot.py": (SAME, "VariableStatisticsPlot"),
    _E + "accumulate/__init__.py": (COMPAT, "PPE's accumulate package"),
    _E + "accumulate/_accumulate_base.py": (COMPAT, "PPE's path"),
    _E + "accumulate/average_accumulate.py": (COMPAT, "PPE's path"),
    _E + "accumulate/max_accumulate.py": (COMPAT, "PPE's path"),
    _E + "accumulate/min_accumulate.py": (COMPAT, "PPE's path"),
    _E + "accumulate/standard_deviation_accumulate.py": (COMPAT, "PPE's path"),
    _E + "accumulate/unbiased_standard_deviation_accumulate.py": (COMPAT, "PPE's path"),
    _E + "best_value.py": (COMPAT, "PPE's path"),
    _E + "evaluator.py": (COMPAT, "PPE's path (replaced by the implementation module)"),
    _E + "fail_on_non_number.py": (COMPAT, "PPE's path"),
    _E + "log_report.py": (COMPAT, "PPE's path"),
    _E + "lr_scheduler.py": (COMPAT, "PPE's path"),
    _E + "micro_average.py": (COMPAT, "PPE's path"),
    _E + "parameter_statistics.py": (COMPAT, "PPE's path"),
    _E + "plot_report.py": (COMPAT, "PPE's path"),
    _E + "print_report.py": (COMPAT, "PPE's path"),
    _E + "print_report_notebook.py": (COMPAT, "PPE's path"),
    _E + "profile_report.py": (COMPAT, "PPE's path"),
    _E + "progress_bar.py": (COMPAT, "PPE's path"),
    _E + "progress_bar_notebook.py": (COMPAT, "PPE's path"),
    _E + "slack.py": (COMPAT, "PPE's path"),
    _E + "snapshot_writers.py": (COMPAT, "PPE's path of the writers"),
    _E + "timeline_trace.py": (COMPAT, "PPE's path"),
    _E + "util.py": (COMPAT, "PPE's path"),
    _E + "value_observation.py": (COMPAT, "PPE's path"),
    _E + "variable_statistics_plot.py": (COMPAT, "PPE's path"),
    # training: triggers
    _TR + "__init__.py": (SAME, "the triggers namespace"),
    _TR + "_base.py": (SAME, "Trigger and the trigger protocol"),
    _TR + "_checks.py": (
        BEYOND,
        "trigger arguments checked with messages, periods read as exact fractions, a value "
        "trigger's check without a mean of its key explained (PPE: an assert on the unit, "
        "float epoch counts, a KeyError or a bare warning)",
    ),
    _TR + "_due.py": (SAME, "due-iteration checks for every-iteration extensions"),
    _TR + "_early_stopping_state.py": (
        BEYOND,
        "EarlyStoppingTrigger's state in snapshots: best value, count, inner triggers and "
        "summary (PPE saves none: a resumed run restarts the count)",
    ),
    _TR + "_factory.py": (SAME, "get_trigger"),
    _TR + "_function.py": (SAME, "FunctionTrigger"),
    _TR + "_interval.py": (SAME, "IntervalTrigger, ManualScheduleTrigger"),
    _TR + "_once.py": (SAME, "OnceTrigger"),
    _TR + "_time.py": (SAME, "TimeTrigger"),
    _TR + "_value.py": (SAME, "MinValueTrigger, MaxValueTrigger, EarlyStoppingTrigger"),
    _TR + "early_stopping_trigger.py": (COMPAT, "PPE's path"),
    _TR + "function_trigger.py": (COMPAT, "PPE's path"),
    _TR + "interval_trigger.py": (COMPAT, "PPE's path"),
    _TR + "manual_schedule_trigger.py": (COMPAT, "PPE's path"),
    _TR + "minmax_value_trigger.py": (COMPAT, "PPE's path"),
    _TR + "once_trigger.py": (COMPAT, "PPE's path"),
    _TR + "time_trigger.py": (COMPAT, "PPE's path"),
}

#: ppe-core files outside the compared parts (a path, or a directory ending in "/") -> why.
#: PPE's counterparts of these are left out on its side too.
NOT_COUNTED: dict[str, str] = {
    "ppe_core/__init__.py": "the top-level face (PPE's __init__ is not counted either)",
    "ppe_core/__main__.py": "the CLI (python -m ppe_core plugins|info)",
    "ppe_core/_version.py": "the version",
    "ppe_core/_compat.py": "the compatibility table the tests read (not imported at run time)",
    "ppe_core/_not_provided.py": "PPE names left out, with what to use (every package's shims)",
    "ppe_core/_compile.py": "ppe.compile (PPE's _dynamo)",
    "ppe_core/_requires.py": "ppe.requires (PPE's _torch_version)",
    "ppe_core/errors.py": "the error classes of every layer (PPE defines its few inline)",
    "ppe_core/logging.py": "PPE's logging.py",
    "ppe_core/_plugins.py": "the plugin host (PPE has no plugins)",
    "ppe_core/plugins.py": "the plugin host's public face",
    "ppe_core/hookspecs.py": "the plugin hook specs",
    "ppe_core/_builtin/": "the built-in plugins",
    "ppe_core/_record.py": "ppe.profiler.record (PPE's profiler/)",
    "ppe_core/_tracing.py": "the profiler's tracer (PPE's profiler/)",
    "ppe_core/_time_summary.py": "TimeSummary (PPE's profiler/)",
    "ppe_core/profiler.py": "ppe.profiler (PPE's profiler/)",
    "ppe_core/config/": "ppe.config (PPE's config.py)",
    "ppe_core/dataloaders/": "PPE's dataloaders/",
    "ppe_core/distributed/": "PPE's distributed/",
    "ppe_core/engine/": "create_trainer / create_evaluator (PPE's engine.py)",
    "ppe_core/nn/": "PPE's nn/",
    "ppe_core/testing/": "the conformance kit and the emulated device (PPE's testing.py)",
    "ppe_core/tracking/": "the base of experiment-tracker extensions (PPE has none)",
    "ppe_core/writing/": "the writers (PPE's writing/)",
}


@dataclass(frozen=True)
class Count:
    """The size of some source: physical lines, code lines and logical lines."""

    lines: int = 0
    code: int = 0
    logical: int = 0

    def __add__(self, other: Count) -> Count:
        return Count(self.lines + other.lines, self.code + other.code, self.logical + other.logical)

    def __sub__(self, other: Count) -> Count:
        return Count(self.lines - other.lines, self.code - other.code, self.logical - other.logical)


#: Token types that are layout or comments, never code.
_NOT_CODE = frozenset(
    {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    }
)

Position = tuple[int, int]


def _docstring_spans(source: str) -> list[tuple[Position, Position]]:
    """(start, end) of every statement that is only a string literal, as tokenize positions.

    ``ast`` gives columns in UTF-8 bytes, ``tokenize`` in characters: converted here.
    """
    lines = source.splitlines(keepends=True)

    def column(lineno: int, byte_offset: int) -> int:
        return len(lines[lineno - 1].encode("utf-8")[:byte_offset].decode("utf-8", "replace"))

    spans = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and node.end_lineno is not None
            and node.end_col_offset is not None
        ):
            start = (node.lineno, column(node.lineno, node.col_offset))
            end = (node.end_lineno, column(node.end_lineno, node.end_col_offset))
            spans.append((start, end))
    return spans


def _line_facts(source: str) -> tuple[int, set[int], list[int]]:
    """``source``'s physical line count, its code lines and the first line of each logical
    line (statement), docstrings left out."""
    spans = _docstring_spans(source)
    code_lines: set[int] = set()
    statements: list[int] = []
    first: int | None = None  # the first code line since the last NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NEWLINE:
            if first is not None:
                statements.append(first)
            first = None
            continue
        if token.type in _NOT_CODE:
            continue
        if any(start <= token.start and token.end <= end for start, end in spans):
            continue  # a docstring
        code_lines.update(range(token.start[0], token.end[0] + 1))
        if first is None:
            first = token.start[0]
    if first is not None:
        statements.append(first)  # a last statement without a newline
    return len(source.splitlines()), code_lines, statements


def count_source(source: str, span: tuple[int, int] | None = None) -> Count:
    """Counts ``source`` (or its lines ``span``, first and last included): see the module
    docstring for what each number means. A statement counts where it starts."""
    total, code_lines, statements = _line_facts(source)
    first, last = span if span is not None else (1, total)
    return Count(
        last - first + 1 if span is not None else total,
        sum(first <= line <= last for line in code_lines),
        sum(first <= line <= last for line in statements),
    )


def _defines(node: ast.stmt, name: str) -> bool:
    """Whether the statement ``node`` defines ``name`` (a def, a class or an assignment)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def symbol_span(source: str, qualname: str) -> tuple[int, int] | None:
    """The lines of the definition ``qualname`` (``"f"``, ``"C.m"``, ``"C.D.m"``, ``"NAME"``)
    in ``source``, its decorators included; None when there is no such definition."""
    body: list[ast.stmt] = ast.parse(source).body
    found: ast.stmt | None = None
    for name in qualname.split("."):
        found = next((node for node in body if _defines(node, name)), None)
        if found is None:
            return None
        body = found.body if isinstance(found, ast.ClassDef) else []
    assert found is not None and found.end_lineno is not None
    decorators = getattr(found, "decorator_list", [])
    return min([found.lineno, *(d.lineno for d in decorators)]), found.end_lineno


def count_file(path: Path) -> Count:
    """Counts the Python file at ``path`` (read in its declared encoding)."""
    with tokenize.open(path) as stream:
        return count_source(stream.read())


# --- which files -----------------------------------------------------------------------------


def _python_files(base: Path, dirs: Iterable[str], modules: Iterable[str]) -> list[str]:
    """The ``.py`` files under ``dirs`` and the ``modules`` of ``base``, as posix paths."""
    found = {m for m in modules if (base / m).is_file()}
    for directory in dirs:
        found.update(p.relative_to(base).as_posix() for p in (base / directory).rglob("*.py"))
    return sorted(found)


def counted_files(root: Path = ROOT) -> list[str]:
    """The ppe-core files of the compared parts, relative to ``root``."""
    return _python_files(root, PART_DIRS, EXTRA_MODULES)


def _not_counted(path: str) -> bool:
    return any(path == key or (key.endswith("/") and path.startswith(key)) for key in NOT_COUNTED)


def problems(root: Path = ROOT) -> list[str]:
    """What keeps the tables from covering ``root``'s ppe_core exactly (empty: nothing).

    Every counted file must have a row in :data:`FILES`, every other ``ppe_core`` file must
    be in :data:`NOT_COUNTED`, and every row must name an existing file.
    """
    counted = set(counted_files(root))
    found: list[str] = []
    for path in sorted(counted - set(FILES)):
        found.append(f"{path}: counted but not classified; add it to FILES in {_THIS_FILE}")
    for path in sorted(set(FILES) - counted):
        found.append(f"{path}: classified in FILES but not a counted file (moved or removed?)")
    for path in _python_files(root, ["ppe_core"], []):
        if path not in counted and not _not_counted(path):
            found.append(
                f"{path}: neither counted nor in NOT_COUNTED; add it to FILES (if it belongs "
                "to training, runtime, handler or reporting) or to NOT_COUNTED, with the reason"
            )
    for key in NOT_COUNTED:
        if not (root / key).exists():
            found.append(f"{key}: in NOT_COUNTED but not in the tree (moved or removed?)")
    return found


#: Whole definitions counted apart from their file's class (see the module docstring).
SYMBOLS_FILE = Path(__file__).resolve().parent / "code_size_symbols.json"


@dataclass(frozen=True)
class Symbol:
    """One definition counted apart: on ``side`` ``"ppe_core"`` (``file`` relative to the
    repository root, ``to`` :data:`SAME` or :data:`BEYOND`) or ``"ppe"`` (``file`` relative
    to ``pytorch_pfn_extras``, ``to`` :data:`NOT_PROVIDED`)."""

    side: str
    file: str
    symbol: str
    to: str
    why: str
    ppe: str


def load_symbols(path: Path = SYMBOLS_FILE) -> list[Symbol]:
    """The entries of ``path`` (a JSON list of objects with :class:`Symbol`'s fields)."""
    return [Symbol(**entry) for entry in json.loads(path.read_text())]


def symbol_problems(
    symbols: Sequence[Symbol], root: Path = ROOT, package: Path | None = None
) -> list[str]:
    """What is wrong with ``symbols`` against the trees (empty: nothing). PPE's entries are
    checked only when ``package`` (PPE's package directory) is given."""
    found: list[str] = []
    spans: dict[tuple[str, str], list[tuple[int, int, str]]] = {}
    for entry in symbols:
        where = f"{entry.side}:{entry.file}:{entry.symbol}"
        if not entry.why or not entry.ppe:
            found.append(f"{where}: every entry says why and what PPE does instead")
        if entry.side == "ppe_core":
            cls = FILES.get(entry.file, ("", ""))[0]
            if cls not in (SAME, BEYOND) or entry.to not in (SAME, BEYOND) or entry.to == cls:
                found.append(
                    f"{where}: moves a definition of a {cls or 'not counted'} file to "
                    f"{entry.to!r}; only same -> beyond-ppe and beyond-ppe -> same are allowed"
                )
                continue
            base = root
        elif entry.side == "ppe" and entry.to == NOT_PROVIDED:
            if package is None:
                continue
            base = package
        else:
            found.append(f"{where}: side 'ppe' takes to 'not-provided', side 'ppe_core' not")
            continue
        if not (base / entry.file).is_file():
            found.append(f"{where}: no such file")
            continue
        span = symbol_span((base / entry.file).read_text(), entry.symbol)
        if span is None:
            found.append(f"{where}: no such definition (renamed or removed?)")
            continue
        for first, last, other in spans.setdefault((entry.side, entry.file), []):
            if first <= span[1] and span[0] <= last:
                found.append(f"{where}: overlaps {other}")
        spans[(entry.side, entry.file)].append((*span, entry.symbol))
    return found


def symbol_count(base: Path, entry: Symbol) -> Count:
    """The size of ``entry``'s definition under ``base``."""
    source = (base / entry.file).read_text()
    span = symbol_span(source, entry.symbol)
    assert span is not None, entry
    return count_source(source, span)


# --- lines that follow a definition of the other class ---------------------------------------
#
# Moving a definition out of its file's class leaves behind lines that exist only because of
# it: the import that brings a beyond-ppe check into a same file, the statement that calls it,
# the ``__all__`` entry that exports it. Those lines count with the definition they serve.


@dataclass(frozen=True)
class Follower:
    """Lines of ``file`` counted in class ``to`` because they serve definitions of that class:
    ``kind`` is ``"import"``, ``"export"`` or ``"call"``; ``names`` what they import, export
    or call."""

    file: str
    to: str
    kind: str
    names: tuple[str, ...]
    count: Count


def _module_level(body: Sequence[ast.stmt]) -> Iterable[ast.stmt]:
    """The module's statements, those under a module-level ``if`` (``TYPE_CHECKING``) or
    ``try`` (an optional import) included."""
    for node in body:
        if isinstance(node, (ast.If, ast.Try)):
            yield from _module_level(node.body)
            for handler in getattr(node, "handlers", []):
                yield from _module_level(handler.body)
            yield from _module_level(node.orelse)
            yield from _module_level(getattr(node, "finalbody", []))
        else:
            yield node


class _Classes:
    """The class of a name in the counted files: a definition's file class, or its symbol
    entry's; an imported name has the class of the definition it imports, followed through
    the counted files; anything else (``errors.py``, torch) has none (None)."""

    def __init__(self, root: Path, files: Mapping[str, str], symbols: Sequence[Symbol]) -> None:
        self.root = root
        self.files = files
        self.moved = {(s.file, s.symbol): s.to for s in symbols if s.side == "ppe_core"}
        self._trees: dict[str, ast.Module] = {}
        self._names: dict[tuple[str, str], str | None] = {}
        self._spans: dict[tuple[str, str], tuple[int, int] | None] = {}

    def span(self, path: str, qualname: str) -> tuple[int, int] | None:
        """:func:`symbol_span` of ``qualname`` in ``path`` (cached: every call site asks)."""
        key = (path, qualname)
        if key not in self._spans:
            self._spans[key] = symbol_span((self.root / path).read_text(), qualname)
        return self._spans[key]

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse((self.root / path).read_text())
        return self._trees[path]

    def module_file(self, dotted: str) -> str | None:
        """The counted file of the module ``dotted`` (``ppe_core.training._manager``)."""
        stem = dotted.replace(".", "/")
        return next((p for p in (f"{stem}.py", f"{stem}/__init__.py") if p in self.files), None)

    def of_module(self, path: str) -> str | None:
        """A whole module's class: its file's, when none of its definitions is counted apart."""
        cls = self.files[path]
        if cls not in (SAME, BEYOND) or any(file == path for file, _ in self.moved):
            return None
        return cls

    def of_import(self, module: str, name: str) -> str | None:
        """The class of ``from module import name`` (a definition or a submodule)."""
        path = self.module_file(module)
        if path is not None:
            return self.of_name(path, name)
        submodule = self.module_file(f"{module}.{name}")
        return None if submodule is None else self.of_module(submodule)

    def of_name(self, path: str, name: str) -> str | None:
        """The class of the module-level ``name`` of the counted file ``path``."""
        key = (path, name)
        if key in self._names:
            return self._names[key]
        self._names[key] = None  # an import cycle resolves to no class
        found: str | None = None
        for node in _module_level(self.tree(path).body):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                alias = next((a for a in node.names if (a.asname or a.name) == name), None)
                if alias is not None:
                    found = self.of_import(node.module, alias.name)
                    break
            elif _defines(node, name):
                found = self.moved.get(key, self.files[path])
                break
        if found not in (SAME, BEYOND):
            found = None
        self._names[key] = found
        return found


def _code_count(code_lines: set[int], lines: Iterable[int], statements: int) -> Count:
    moved = [line for line in lines if line in code_lines]
    return Count(len(moved), len(moved), statements)


def _other(cls: str) -> str:
    return BEYOND if cls == SAME else SAME


def _spans_of(classes: _Classes, path: str, to: str) -> list[tuple[int, int]]:
    """The lines of ``path``'s definitions counted apart into ``to``."""
    spans = [
        classes.span(path, symbol)
        for (file, symbol), cls in classes.moved.items()
        if file == path and cls == to
    ]
    return [span for span in spans if span is not None]


def _name_uses(tree: ast.Module) -> dict[str, list[int]]:
    """The lines on which each name is read or written (not counting import statements)."""
    uses: dict[str, list[int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            uses.setdefault(node.id, []).append(node.lineno)
    return uses


def _within(lines: Sequence[int], spans: Sequence[tuple[int, int]]) -> bool:
    """Whether ``lines`` is not empty and every line lies in one of ``spans``."""
    return bool(lines) and all(any(a <= n <= b for a, b in spans) for n in lines)


def _moved_imports(
    tree: ast.Module, code_lines: set[int], moves: Callable[[ast.stmt, ast.alias], bool]
) -> Iterable[tuple[tuple[str, ...], Count]]:
    """The import statements (or their lines) whose every name ``moves``: a statement whose
    names all move goes whole, otherwise the lines whose names all do (never the first line,
    which opens the statement for the names that stay)."""
    for node in _module_level(tree.body):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        by_line: dict[int, list[bool]] = {}
        for alias in node.names:
            by_line.setdefault(alias.lineno, []).append(moves(node, alias))
        assert node.end_lineno is not None
        if all(all(flags) for flags in by_line.values()):
            lines: Iterable[int] = range(node.lineno, node.end_lineno + 1)
            statements = 1
        else:
            lines = [n for n, flags in by_line.items() if all(flags) and n != node.lineno]
            statements = 0
        count = _code_count(code_lines, lines, statements)
        if count.code:
            yield tuple(_bound(alias) for alias in node.names), count


def _bound(alias: ast.alias) -> str:
    """The name an import binds (``import a.b`` binds ``a``)."""
    return alias.asname or alias.name.split(".")[0]


def _import_followers(
    classes: _Classes, path: str, tree: ast.Module, code_lines: set[int]
) -> Iterable[Follower]:
    """Imports that serve only code of the other class: in a same file, of beyond-ppe names
    (whatever uses them reaches for behaviour PPE lacks); in either, of names used only inside
    the file's definitions counted in the other class."""
    cls = classes.files[path]
    other = _other(cls)
    spans = _spans_of(classes, path, other)
    uses = _name_uses(tree)

    def moves(node: ast.stmt, alias: ast.alias) -> bool:
        if _within(uses.get(_bound(alias), []), spans):
            return True
        if cls != SAME or not isinstance(node, ast.ImportFrom) or not node.module or node.level:
            return False
        return classes.of_import(node.module, alias.name) == BEYOND

    for names, count in _moved_imports(tree, code_lines, moves):
        yield Follower(path, other, "import", names, count)


def ppe_left_out_imports(package: Path, symbols: Sequence[Symbol]) -> list[Follower]:
    """PPE's import lines used only inside its definitions that ppe-core does not provide:
    they leave PPE's side with those definitions (the rule ppe-core's imports follow)."""
    found: list[Follower] = []
    for path in sorted({s.file for s in symbols if s.side == "ppe"}):
        source = (package / path).read_text()
        spans = [
            symbol_span(source, s.symbol) for s in symbols if s.side == "ppe" and s.file == path
        ]
        tree = ast.parse(source)
        uses = _name_uses(tree)
        _, code_lines, _ = _line_facts(source)
        inside = [span for span in spans if span is not None]

        def moves(
            node: ast.stmt,
            alias: ast.alias,
            uses: dict[str, list[int]] = uses,
            inside: list[tuple[int, int]] = inside,
        ) -> bool:
            return _within(uses.get(_bound(alias), []), inside)

        for names, count in _moved_imports(tree, code_lines, moves):
            found.append(Follower(path, NOT_PROVIDED, "import", names, count))
    return found


def _export_followers(
    classes: _Classes, path: str, tree: ast.Module, code_lines: set[int]
) -> Iterable[Follower]:
    """Entries of ``__all__`` (or a lazy ``_EXPORTS`` table of names to modules) that export
    only definitions of the other class: an export line serves what it exports."""
    cls = classes.files[path]
    for node in _module_level(tree.body):
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if not (isinstance(target, ast.Name) and target.id in ("__all__", "_EXPORTS")):
            continue
        value = node.value  # type: ignore[attr-defined]
        pairs: list[tuple[ast.expr, str | None]] = []
        if isinstance(value, (ast.List, ast.Tuple)):
            for element in value.elts:
                name = element.value if isinstance(element, ast.Constant) else None
                found = classes.of_name(path, name) if isinstance(name, str) else None
                pairs.append((element, found))
        elif isinstance(value, ast.Dict):
            for key, module in zip(value.keys, value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(module, ast.Constant):
                    found = None
                    if isinstance(key.value, str) and isinstance(module.value, str):
                        found = classes.of_import(module.value, key.value)
                    pairs.append((key, found))
        by_line: dict[int, list[tuple[str, bool]]] = {}
        for element, element_cls in pairs:
            name = str(getattr(element, "value", "?"))
            by_line.setdefault(element.lineno, []).append((name, element_cls == _other(cls)))
        lines = [n for n, found in by_line.items() if n != node.lineno and all(m for _, m in found)]
        count = _code_count(code_lines, lines, 0)
        if count.code:
            names = tuple(name for n in lines for name, _ in by_line[n])
            yield Follower(path, _other(cls), "export", names, count)


def _callee(classes: _Classes, path: str, func: ast.expr, owner: str | None) -> str | None:
    """The class of what ``func`` names: a module-level name, ``module.name`` of an imported
    counted module, or ``self.method`` of the enclosing class ``owner``."""
    if isinstance(func, ast.Name):
        return classes.of_name(path, func.id)
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        return None
    base = func.value.id
    if base == "self":
        # A method of the enclosing class in this file: its entry's class, else its class's.
        if owner is None or classes.span(path, f"{owner}.{func.attr}") is None:
            return None
        cls = classes.moved.get((path, f"{owner}.{func.attr}"))
        return cls or classes.moved.get((path, owner), classes.files[path])
    for node in _module_level(classes.tree(path).body):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if (alias.asname or alias.name) == base:
                    module = classes.module_file(f"{node.module}.{alias.name}")
                    return None if module is None else classes.of_name(module, func.attr)
    return None


def _call_followers(
    classes: _Classes, path: str, tree: ast.Module, code_lines: set[int]
) -> Iterable[Follower]:
    """Statements of same-behaviour code that only call a beyond-ppe function (a check, a
    record of ppe-core's own state): the statement's effect is the callee's."""

    def visit(
        body: Sequence[ast.stmt], prefix: str, owner: str | None, cls: str
    ) -> Iterable[Follower]:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = f"{prefix}{node.name}"
                inner = classes.moved.get((path, qualname), cls)
                is_class = isinstance(node, ast.ClassDef)
                # Entries name module-level definitions and class members, never locals.
                yield from visit(
                    node.body,
                    f"{qualname}." if is_class else f"{qualname}.<locals>.",
                    qualname if is_class else owner,
                    inner,
                )
                continue
            if (
                cls == SAME
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Call)
                and _callee(classes, path, node.value.func, owner) == BEYOND
            ):
                assert node.end_lineno is not None
                lines = range(node.lineno, node.end_lineno + 1)
                name = ast.unparse(node.value.func)
                yield Follower(path, BEYOND, "call", (name,), _code_count(code_lines, lines, 1))
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from visit(getattr(node, field, []), prefix, owner, cls)

    yield from visit(tree.body, "", None, classes.files[path])


def followers(root: Path, files: Mapping[str, str], symbols: Sequence[Symbol]) -> list[Follower]:
    """The lines of ``files`` (path -> class) that follow a definition of the other class.

    A statement's class is its innermost enclosing definition's (its entry's, else its
    file's), so a call inside a definition counted same in a beyond-ppe file is read as same
    code; a definition counted apart moves whole with its entry. An import or ``__all__``
    statement moves whole when every name in it does, otherwise line by line (never its first
    line, which opens the statement for the names that stay).
    """
    classes = _Classes(root, files, symbols)
    found: list[Follower] = []
    for path, cls in files.items():
        if cls not in (SAME, BEYOND):
            continue
        source = (root / path).read_text()
        _, code_lines, _ = _line_facts(source)
        tree = classes.tree(path)
        found += _import_followers(classes, path, tree, code_lines)
        found += _export_followers(classes, path, tree, code_lines)
        found += _call_followers(classes, path, tree, code_lines)
    return found


def part_of(path: str) -> str:
    """The part a counted file belongs to: ``training``, ``training/extensions``,
    ``training/triggers``, ``runtime``, ``handler`` or ``reporting`` (either side's paths,
    relative to the repository root or to ``pytorch_pfn_extras``)."""
    if path in EXTRA_MODULES:
        return EXTRA_MODULES[path]
    if path in PPE_EXTRA_MODULES:
        return PPE_EXTRA_MODULES[path]
    parts = path.removeprefix("ppe_core/").split("/")
    if parts[0] == "training" and len(parts) > 2 and parts[1] in ("extensions", "triggers"):
        return f"training/{parts[1]}"
    return parts[0].removesuffix(".py")


PARTS = (
    "training",
    "training/extensions",
    "training/triggers",
    "runtime",
    "handler",
    "reporting",
)


def ppe_package() -> Path | None:
    """The installed ``pytorch_pfn_extras`` package directory (not imported), or None."""
    spec = importlib.util.find_spec("pytorch_pfn_extras")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def ppe_files(package: Path) -> list[str]:
    """PPE's files of the compared parts, relative to its package directory."""
    return _python_files(package, PPE_PART_DIRS, PPE_EXTRA_MODULES)


# --- the report ------------------------------------------------------------------------------


def _table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table; columns after the first are right-aligned, except a last "why"."""
    cells = [list(head), *(list(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    text_last = head[-1] == "why"

    def cell(i: int, value: str) -> str:
        left = i == 0 or (text_last and i == len(head) - 1)
        return value.ljust(widths[i]) if left else value.rjust(widths[i])

    lines = []
    for n, row in enumerate(cells):
        lines.append("| " + " | ".join(cell(i, v) for i, v in enumerate(row)) + " |")
        if n == 0:
            rule = [
                "-" * (w + 1) + (":" if i and not (text_last and i == len(head) - 1) else "-")
                for i, w in enumerate(widths)
            ]
            lines.append("|" + "|".join(rule) + "|")
    return "\n".join(lines)


def _numbers(count: Count) -> list[str]:
    return [str(count.lines), str(count.code), str(count.logical)]


def _sum(counts: Iterable[Count]) -> Count:
    total = Count()
    for count in counts:
        total += count
    return total


def report(
    root: Path = ROOT,
    package: Path | None = None,
    symbols: Sequence[Symbol] | None = None,
    *,
    follow: bool = True,
) -> str:
    """The whole report as text: a table per class (files whole), the definitions counted
    apart, by part, the totals, what is not counted.

    Args:
        root: The repository root.
        package: PPE's package directory (default: the installed one, if any).
        symbols: The definitions counted apart (default: :data:`SYMBOLS_FILE`'s).
        follow: Whether the lines that follow a definition of the other class move with it
            (:func:`followers`).

    Raises:
        ValueError: The tables do not cover the tree (see :func:`problems`) or an entry of
            ``symbols`` is wrong (see :func:`symbol_problems`).
    """
    found = problems(root)
    if found:
        raise ValueError("the classification tables do not match the tree:\n" + "\n".join(found))
    ppe = package if package is not None else ppe_package()
    symbols = load_symbols() if symbols is None else symbols
    found = symbol_problems(symbols, root, ppe)
    if found:
        raise ValueError(f"the entries of {SYMBOLS_FILE.name} are wrong:\n" + "\n".join(found))
    ours = {path: count_file(root / path) for path in counted_files(root)}
    out: list[str] = []
    whole: dict[str, Count] = {}
    for cls, meaning in CLASSES.items():
        paths = [p for p in ours if FILES[p][0] == cls]
        whole[cls] = _sum(ours[p] for p in paths)
        out.append(f"\n{cls}: {meaning} ({len(paths)} files, counted whole)\n")
        rows = [[p, *_numbers(ours[p]), FILES[p][1]] for p in paths]
        rows.append(["total", *_numbers(whole[cls]), ""])
        out.append(_table(["file", "lines", "code", "logical", "why"], rows))

    theirs: dict[str, Count] = {}
    if ppe is None:
        out.append(
            "\nPPE: pytorch_pfn_extras is not installed, so PPE's parts are not counted "
            "(pip install 'ppe-core[bench]')."
        )
    else:
        theirs = {path: count_file(ppe / path) for path in ppe_files(ppe)}

    # (part, class) -> code of ppe-core with the definitions moved; part -> PPE's left out.
    split: dict[tuple[str, str], Count] = {}
    for path, count in ours.items():
        key = (part_of(path), FILES[path][0])
        split[key] = split.get(key, Count()) + count
    left_out: dict[str, Count] = {}
    rows = []
    for entry in symbols:
        if entry.side == "ppe" and ppe is None:
            continue
        count = symbol_count(root if entry.side == "ppe_core" else ppe, entry)  # type: ignore[arg-type]
        part = part_of(entry.file)
        if entry.side == "ppe_core":
            moved = f"{FILES[entry.file][0]} -> {entry.to}"
            source = (part, FILES[entry.file][0])
            split[source] = split[source] - count
            split[(part, entry.to)] = split.get((part, entry.to), Count()) + count
        else:
            moved = f"PPE {entry.to}"
            left_out[part] = left_out.get(part, Count()) + count
        rows.append(
            [
                f"{entry.file}:{entry.symbol}",
                str(count.code),
                moved,
                f"{entry.why} PPE: {entry.ppe}",
            ]
        )
    out.append(
        f"\nDefinitions counted apart from their file's class ({len(rows)}; "
        f"{SYMBOLS_FILE.relative_to(ROOT).as_posix()})\n"
    )
    out.append(_table(["definition", "code", "moved", "why"], rows))

    moving = followers(root, {p: FILES[p][0] for p in ours}, symbols) if follow else []
    if follow and ppe is not None:
        moving += ppe_left_out_imports(ppe, symbols)
    rows = []
    for item in moving:
        part = part_of(item.file)
        if item.to == NOT_PROVIDED:
            left_out[part] = left_out.get(part, Count()) + item.count
            moved = f"PPE {NOT_PROVIDED}"
        else:
            source = (part, _other(item.to))
            split[source] = split[source] - item.count
            split[(part, item.to)] = split.get((part, item.to), Count()) + item.count
            moved = f"{_other(item.to)} -> {item.to}"
        names = ", ".join(item.names)
        names = names if len(names) <= 60 else names[:57] + "..."
        rows.append([item.file, item.kind, names, str(item.count.code), moved])
    if follow:
        out.append(
            f"\nLines that follow a definition counted in another class ({len(rows)} places, "
            f"{_sum(item.count for item in moving).code} code lines; see followers())\n"
        )
        out.append(_table(["file", "kind", "names", "code", "moved"], rows))

    out.append("\nBy part (code lines)\n")
    head = ["part", "same, files whole", *CLASSES, "ppe_core without compat"]
    head += ["PPE 0.9 all", "PPE 0.9 provided"] if ppe else []
    rows = []
    for part in PARTS:
        mine = [p for p in ours if part_of(p) == part]
        row = [part, str(_sum(ours[p] for p in mine if FILES[p][0] == SAME).code)]
        row += [str(split.get((part, cls), Count()).code) for cls in CLASSES]
        row.append(str(_sum(ours[p] for p in mine if FILES[p][0] != COMPAT).code))
        if ppe is not None:
            all_ppe = _sum(c for p, c in theirs.items() if part_of(p) == part)
            row += [str(all_ppe.code), str((all_ppe - left_out.get(part, Count())).code)]
        rows.append(row)
    out.append(_table(head, rows))

    totals = {cls: _sum(c for (_, k), c in split.items() if k == cls) for cls in CLASSES}
    out.append("\nTotals\n")
    rows = []
    for cls in CLASSES:
        files = str(sum(FILES[p][0] == cls for p in ours))
        if cls != COMPAT:
            rows.append([f"ppe_core {cls}, files whole", files, *_numbers(whole[cls])])
        rows.append([f"ppe_core {cls}", files, *_numbers(totals[cls])])
    rows.append(
        [
            "ppe_core without compat",
            str(sum(FILES[p][0] != COMPAT for p in ours)),
            *_numbers(whole[SAME] + whole[BEYOND]),
        ]
    )
    rows.append(["ppe_core all", str(len(ours)), *_numbers(_sum(ours.values()))])
    if ppe is not None:
        all_ppe = _sum(theirs.values())
        rows.append([f"PPE {_ppe_version()} all", str(len(theirs)), *_numbers(all_ppe)])
        rows.append(
            [
                f"PPE {_ppe_version()} provided by ppe-core",
                str(len(theirs)),
                *_numbers(all_ppe - _sum(left_out.values())),
            ]
        )
    out.append(_table(["", "files", "lines", "code", "logical"], rows))

    out.append("\nNot counted (ppe_core files outside the compared parts)\n")
    rows = []
    outside = Count()
    for where, why in NOT_COUNTED.items():
        paths = [where] if not where.endswith("/") else _python_files(root, [where], [])
        count = _sum(count_file(root / p) for p in paths)
        outside += count
        rows.append([where, *_numbers(count), why])
    # The total shows code moved out of the compared parts (into writing/, say): it leaves the
    # comparison but not the package.
    rows.append(["total", *_numbers(outside), ""])
    out.append(_table(["file", "lines", "code", "logical", "why"], rows))
    return "\n".join(out).lstrip("\n")


def _ppe_version() -> str:
    try:
        return importlib.metadata.version("pytorch-pfn-extras")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the report; returns 2 (after saying why) when a file is not classified."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.code_size", description=__doc__.split("\n")[0]
    )
    parser.parse_args(argv)
    found = problems()
    if found:
        print("the classification tables do not match the tree:", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 2
    print("command: .venv/bin/python -m benchmarks.code_size")
    print("code: lines with code (not blank, comment or docstring); logical: statements\n")
    print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
