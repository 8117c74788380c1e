"""ppe-core's benchmark suite: one command, one table.

    .venv/bin/python -m benchmarks                  # every section (instructions: slow)
    .venv/bin/python -m benchmarks --quick          # fewer steps/repeats, no valgrind
    .venv/bin/python -m benchmarks --only step,import
    .venv/bin/python -m benchmarks --only rss --long   # 100k iterations

Sections: ``step`` (per-step overhead over a raw loop, peers when installed), ``eval``
(per-batch evaluation overhead over a raw ``no_grad`` loop), ``import`` (import + plugin
discovery over ``import torch``), ``snapshot`` (stall of a ~50 MB snapshot with a background
writer), ``rss`` (memory growth with the standard extensions), ``instructions`` (valgrind
instruction counts per step), ``gpu`` (transfer options; a stub without CUDA), ``emulated``
(per-step cost on ppe-core's emulated device ``ppe_emu`` beside the CPU runtime), ``log``
(per-iteration LogReport at 1k, 10k and 100k entries, each format) and ``tracking``
(MLflowLogger against a local server beside LogReport alone): see ``bench_log.py``.

Method, chosen to be robust on a shared machine: one torch thread; process CPU time (wall
time only where background work is the point, as for snapshots); per-step costs are marginal
((long run - short run) / extra steps), so one-off set-up cancels; each variant is measured in
an interleaved pair with the raw loop, and the table gives medians and ranges over repeats.
Every training variant's final weights are compared with the raw loop's (bit-identical).
Not part of the test suite: nothing here passes or fails, it prints what it measured.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import ppe_core as ppe

HERE = os.path.dirname(os.path.abspath(__file__))
SECTIONS = (
    "step",
    "eval",
    "import",
    "snapshot",
    "dcp",
    "rss",
    "log",
    "tracking",
    "instructions",
    "gpu",
    "emulated",
)

Batch = dict[str, torch.Tensor]
#: A timed workload: (batches, epochs) -> (seconds, trained model).
Workload = Callable[[list[Batch], int], tuple[float, torch.nn.Module]]


# --- the shared work ------------------------------------------------------------------------


class Tiny(torch.nn.Module):
    """Linear(16, 4) with cross-entropy; ``report`` (if given) is called with the loss each step.

    Passing ``ppe_core.reporting.report`` (or PPE's) reproduces what users write in ``forward``
    (``ppe.reporting.report({"train/loss": loss})``); the raw loop passes nothing.
    """

    def __init__(self, report: Callable[[dict[str, Any]], None] | None = None) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)
        self._report = report

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = torch.nn.functional.cross_entropy(self.fc(x), t)
        if self._report is not None:
            self._report({"train/loss": loss})
        return {"loss": loss}


def batches(n: int, seed: int = 0) -> list[Batch]:
    """``n`` pre-built batches of 8 (the loader is not what is measured)."""
    g = torch.Generator().manual_seed(seed)
    return [
        {"x": torch.randn(8, 16, generator=g), "t": torch.randint(0, 4, (8,), generator=g)}
        for _ in range(n)
    ]


def raw(data: list[Batch], epochs: int) -> tuple[float, torch.nn.Module]:
    """The floor: zero_grad, forward, backward, step, nothing else."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.process_time()
    for _ in range(epochs):
        for batch in data:
            opt.zero_grad()
            loss = model(**batch)["loss"]
            loss.backward()
            opt.step()
    return time.process_time() - start, model


def _sink() -> io.TextIOBase:
    return open(os.devnull, "w")  # closed by the caller


def standard_extensions(pkg: Any, out: Any) -> list[Any]:
    """LogReport + PrintReport + ProgressBar, printing to ``out`` (same code for PPE)."""
    e = pkg.training.extensions
    return [
        e.LogReport(),
        e.PrintReport(["epoch", "iteration", "train/loss"], out=out),
        e.ProgressBar(out=out),
    ]


def trainer(
    pkg: Any,
    extensions: bool,
    report: bool | None = None,
    extra: Callable[[Any], list[Any]] | None = None,
) -> Workload:
    """``pkg.engine.create_trainer`` bare, or with the three extensions and a per-step report.

    ``pkg`` is ``ppe_core`` or ``pytorch_pfn_extras``: ppe-core keeps PPE's API, so the same
    code drives both. ``report`` (default: ``extensions``) makes ``forward`` call
    ``pkg.reporting.report({"train/loss": loss})``. ``extra(pkg)`` gives more extensions.
    """
    reports = extensions if report is None else report

    def run(data: list[Batch], epochs: int) -> tuple[float, torch.nn.Module]:
        torch.manual_seed(0)
        model = pkg.to(Tiny(pkg.reporting.report if reports else None), "cpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with tempfile.TemporaryDirectory() as tmp, _sink() as out:
            ext = standard_extensions(pkg, out) if extensions else []
            ext += extra(pkg) if extra is not None else []
            t = pkg.engine.create_trainer(model, opt, epochs, extensions=ext, out_dir=tmp)
            start = time.process_time()
            t.run(data)
            return time.process_time() - start, model

    return run


def ignite_bare(data: list[Batch], epochs: int) -> tuple[float, torch.nn.Module]:
    """Ignite's bare Engine (no handlers): the floor a framework loop adds."""
    from ignite.engine import Engine

    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(engine: Any, batch: Batch) -> torch.Tensor:
        opt.zero_grad()
        loss = model(**batch)["loss"]
        loss.backward()
        opt.step()
        return loss

    start = time.process_time()
    Engine(step).run(data, max_epochs=epochs)
    return time.process_time() - start, model


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def step_variants() -> tuple[dict[str, Workload], list[str]]:
    """Training variants to compare with ``raw``, and notes about peers that are absent."""
    variants: dict[str, Workload] = {
        "ppe-core bare": trainer(ppe, False),
        "ppe-core +3ext+report": trainer(ppe, True),
    }
    notes = []
    if _installed("pytorch_pfn_extras"):
        import pytorch_pfn_extras

        variants["ppe-0.9 bare"] = trainer(pytorch_pfn_extras, False)
        variants["ppe-0.9 +3ext+report"] = trainer(pytorch_pfn_extras, True)
    else:
        notes.append("pytorch-pfn-extras: not installed (pip install 'ppe-core[bench]')")
    if _installed("ignite"):
        variants["ignite bare"] = ignite_bare
    else:
        notes.append("ignite: not installed (pip install 'ppe-core[bench]')")
    if not _installed("lightning") and not _installed("pytorch_lightning"):
        notes.append("lightning: not installed (not measured)")
    return variants, notes


def _throughput(pkg: Any) -> list[Any]:
    return [pkg.training.extensions.Throughput(flops=True)]


def instruction_variants() -> dict[str, Workload]:
    """What ``bench_step_instructions.py`` counts (valgrind is slow: the main rows only)."""
    variants: dict[str, Workload] = {
        "raw loop": raw,
        "ppe-core bare": trainer(ppe, False),
        "ppe-core +3ext": trainer(ppe, True, report=False),
        "ppe-core +3ext+report": trainer(ppe, True),
        # Throughput with FLOPs: its per-step cost (the sample count) over "ppe-core bare".
        "ppe-core bare +Throughput": trainer(ppe, False, extra=_throughput),
    }
    if _installed("pytorch_pfn_extras"):
        import pytorch_pfn_extras

        variants["ppe-0.9 +3ext+report"] = trainer(pytorch_pfn_extras, True)
    if _installed("ignite"):
        variants["ignite bare"] = ignite_bare
    # Evaluation, per batch, against the raw no_grad loop ("epochs" = passes over the data).
    variants["eval: raw no_grad loop"] = _eval_passes(None)
    variants["eval: ppe-core Evaluator"] = _eval_passes(ppe)
    if _installed("pytorch_pfn_extras"):
        import pytorch_pfn_extras

        variants["eval: ppe-0.9 Evaluator"] = _eval_passes(pytorch_pfn_extras)
    return variants


def _eval_passes(pkg: Any) -> Workload:
    """``passes`` evaluations of ``Tiny``: a raw ``no_grad`` loop, or ``pkg``'s Evaluator."""

    def run(data: list[Batch], passes: int) -> tuple[float, torch.nn.Module]:
        torch.manual_seed(0)
        model = Tiny() if pkg is None else pkg.to(Tiny(), "cpu")
        evaluator = None if pkg is None else pkg.engine.create_evaluator(model)
        start = time.process_time()
        for _ in range(passes):
            if evaluator is None:
                _eval_raw(model, data)
            else:
                evaluator.run(data)
        return time.process_time() - start, model

    return run


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Bit-identical parameters (the variants did the same work)."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- statistics and printing ----------------------------------------------------------------


@dataclass
class Row:
    """One line of the final table."""

    section: str
    name: str
    value: str
    detail: str = ""


@dataclass
class Report:
    """What every section measured, printed as one table at the end."""

    rows: list[Row] = field(default_factory=list)

    def add(self, section: str, name: str, value: str, detail: str = "") -> None:
        self.rows.append(Row(section, name, value, detail))
        print(f"  [{section}] {name}: {value} {detail}", flush=True)

    def table(self) -> str:
        head = ("section", "variant", "result", "detail")
        cells = [head, *((r.section, r.name, r.value, r.detail) for r in self.rows)]
        widths = [max(len(c[i]) for c in cells) for i in range(3)]
        lines = []
        for i, c in enumerate(cells):
            lines.append(
                "| "
                + " | ".join(x.ljust(w) for x, w in zip(c[:3], widths, strict=True))
                + f" | {c[3]} |"
            )
            if i == 0:
                lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|---|")
        return "\n".join(lines)


def med_range(values: Sequence[float], scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    """``median [min, max]`` of ``values * scale``."""
    v = [x * scale for x in values]
    return f"{fmt.format(statistics.median(v))} [{fmt.format(min(v))}, {fmt.format(max(v))}]"


# --- sections -------------------------------------------------------------------------------


def section_step(report: Report, args: argparse.Namespace) -> None:
    """Per-step overhead of each variant over the raw loop, in interleaved pairs."""
    steps, short, long = (200, 1, 3) if args.quick else (500, 1, 4)
    extra = (long - short) * steps
    data = batches(steps)
    variants, notes = step_variants()
    for note in notes:
        report.add("step", note.split(":")[0], "n/a", note.split(":", 1)[1].strip())
    raw(data, short)
    for fn in variants.values():
        fn(data, short)  # warm-up: imports and lazy initialisation
    over: dict[str, list[float]] = {n: [] for n in variants}
    ratio: dict[str, list[float]] = {n: [] for n in variants}
    raws: list[float] = []
    identical: dict[str, bool] = dict.fromkeys(variants, True)
    for _ in range(args.repeats):
        for name, fn in variants.items():
            r_short, _ = raw(data, short)
            v_short, _ = fn(data, short)
            r_long, r_model = raw(data, long)
            v_long, v_model = fn(data, long)
            r_step = (r_long - r_short) / extra
            v_step = (v_long - v_short) / extra
            raws.append(r_step)
            over[name].append(v_step - r_step)
            ratio[name].append(v_step / r_step)
            identical[name] &= same_weights(r_model, v_model)
    report.add(
        "step",
        "raw loop",
        f"{med_range(raws, 1e6)} us/step",
        f"{steps} steps/epoch, {long} vs {short} epochs, {args.repeats} pairs per variant",
    )
    for name in variants:
        report.add(
            "step",
            name,
            f"+{med_range(over[name], 1e6)} us/step",
            f"ratio {med_range(ratio[name], fmt='{:.3f}')}; weights "
            + ("bit-identical to raw" if identical[name] else "DIFFER from raw"),
        )


def _eval_raw(model: torch.nn.Module, data: list[Batch]) -> float:
    start = time.process_time()
    with torch.no_grad():
        for batch in data:
            model(**batch)
    return time.process_time() - start


def _eval_pkg(pkg: Any) -> Callable[[torch.nn.Module, list[Batch]], float]:
    def run(model: torch.nn.Module, data: list[Batch]) -> float:
        evaluator = pkg.engine.create_evaluator(model)
        start = time.process_time()
        evaluator.run(data)
        return time.process_time() - start

    return run


def section_eval(report: Report, args: argparse.Namespace) -> None:
    """Per-batch overhead of ``create_evaluator(...).run`` over a raw ``no_grad`` loop."""
    short, long = (100, 300) if args.quick else (200, 1000)
    data = batches(long, seed=1)
    variants: dict[str, Callable[[torch.nn.Module, list[Batch]], float]] = {
        "ppe-core Evaluator": _eval_pkg(ppe)
    }
    if _installed("pytorch_pfn_extras"):
        import pytorch_pfn_extras

        variants["ppe-0.9 Evaluator"] = _eval_pkg(pytorch_pfn_extras)
    torch.manual_seed(0)
    models = {"ppe-core Evaluator": ppe.to(Tiny(), "cpu")}
    if "ppe-0.9 Evaluator" in variants:
        import pytorch_pfn_extras

        models["ppe-0.9 Evaluator"] = pytorch_pfn_extras.to(Tiny(), "cpu")
    plain = Tiny()
    for name, fn in variants.items():
        fn(models[name], data[:short])
    over: dict[str, list[float]] = {n: [] for n in variants}
    raws: list[float] = []
    for _ in range(args.repeats):
        for name, fn in variants.items():
            r = (_eval_raw(plain, data) - _eval_raw(plain, data[:short])) / (long - short)
            v = (fn(models[name], data) - fn(models[name], data[:short])) / (long - short)
            raws.append(r)
            over[name].append(v - r)
    report.add("eval", "raw no_grad loop", f"{med_range(raws, 1e6)} us/batch")
    for name in variants:
        report.add("eval", name, f"+{med_range(over[name], 1e6)} us/batch")


# Process CPU time, like the step section: wall time of an import on a loaded machine mostly
# measures the other processes (seen: `import torch` from 1.4 s to 9.5 s wall in one hour).
IMPORT_CODE = """
import sys, time
t0 = time.process_time()
import torch
t1 = time.process_time()
{body}
t2 = time.process_time()
print(t1 - t0, t2 - t1, len(sys.modules))
"""
IMPORT_BODIES = {
    "ppe-core + discovery": (
        "import ppe_core as ppe\nppe.runtime.runtime_registry.names()"
        "  # discovery: ppe_cpu, ppe_cuda, ppe_mlflow, ppe_wandb loaded"
    ),
    "pytorch-pfn-extras 0.9": "import pytorch_pfn_extras",
    "ignite": "import ignite.engine",
}


def _import_env() -> dict[str, str]:
    """A user's environment with every first-party plugin installed, bytecode cached.

    This VM sets PYTHONDONTWRITEBYTECODE=1.

    Without cached bytecode every ppe-core module is compiled at each import, which measures
    the compiler rather than the package. The cache goes to a prefix directory in the temp
    folder (filled by a warm-up run), so the repository stays untouched.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # Every first-party plugin that is installed (runtimes and trackers), and only those:
    # another installed plugin's own imports are not ppe-core's start-up cost.
    env["PPE_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    plugins = ("ppe_cpu", "ppe_cuda", "ppe_mlflow", "ppe_wandb")
    env["PPE_PLUGINS"] = ",".join(p for p in plugins if _installed(p))
    env["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "ppe-core-bench-pycache")
    return env


def section_import(report: Report, args: argparse.Namespace) -> None:
    """Import cost (process CPU time) over ``import torch`` in fresh interpreters, medians."""
    env = _import_env()
    bodies = {"ppe-core + discovery": IMPORT_BODIES["ppe-core + discovery"]}
    if _installed("pytorch_pfn_extras"):
        bodies["pytorch-pfn-extras 0.9"] = IMPORT_BODIES["pytorch-pfn-extras 0.9"]
    if _installed("ignite"):
        bodies["ignite"] = IMPORT_BODIES["ignite"]
    repeats = max(3, args.repeats) if args.quick else max(7, args.repeats)
    results: dict[str, tuple[list[float], list[float], int]] = {}
    for name, body in bodies.items():
        code = IMPORT_CODE.format(body=body)
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
        results[name] = ([], [], 0)
    for _ in range(repeats):  # interleaved across variants
        for name, body in bodies.items():
            out = subprocess.run(
                [sys.executable, "-c", IMPORT_CODE.format(body=body)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            results[name][0].append(float(out[0]))
            results[name][1].append(float(out[1]))
            results[name] = (results[name][0], results[name][1], int(out[2]))
    torch_s = [t for r in results.values() for t in r[0]]
    report.add("import", "import torch", f"{med_range(torch_s, 1e3, '{:.0f}')} ms CPU")
    for name, (_, over, modules) in results.items():
        report.add(
            "import",
            name,
            f"+{med_range(over, 1e3)} ms CPU over torch",
            f"{modules} modules in sys.modules; {repeats} fresh interpreters"
            + (f"; PPE_PLUGINS={env['PPE_PLUGINS']}" if name.startswith("ppe-core") else ""),
        )
    probe = (
        "import sys, torch\nbefore = set(sys.modules)\nimport ppe_core as ppe\n"
        "ppe.runtime.runtime_registry.names()\nimport json\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    new = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], env=env, check=True, capture_output=True, text=True
        ).stdout
    )
    heavy = [
        m
        for m in new
        if m.split(".")[0] in {"tqdm", "matplotlib", "tensorboard", "numpy", "mlflow", "wandb"}
        or m.startswith(("torch._dynamo", "torch.distributed", "ppe_core.training"))
        or m.startswith(("ppe_core.handler", "ppe_core.writing", "ppe_core._reporting"))
        or m.startswith(("ppe_extensions.tracking", "ppe_mlflow._logger", "ppe_wandb._logger"))
    ]
    report.add(
        "import",
        "modules ppe-core adds",
        str(len(new)),
        "of them heavy/training: " + (", ".join(heavy) or "none"),
    )


def section_snapshot(report: Report, args: argparse.Namespace) -> None:
    """Wall time of a run snapshotting a ~50 MB model every few iterations vs none."""
    iterations, every = (20, 10) if args.quick else (40, 10)
    long_run = 0 if args.quick else 100  # a longer run: the final flush weighs less
    width = 3620  # Linear(3620, 3620): 13.1 M float32 parameters, 52 MB
    g = torch.Generator().manual_seed(0)
    data = [
        {"x": torch.randn(8, width, generator=g), "t": torch.randint(0, width, (8,), generator=g)}
        for _ in range(max(iterations, long_run))
    ]

    class Wide(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(width, width)

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.cross_entropy(self.fc(x), t)}

    def run(writer: str | None, steps: int = iterations) -> tuple[float, float]:
        """(wall time of run(), time to the end of the last training step)."""
        torch.manual_seed(0)
        model = ppe.to(Wide(), "cpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        last_step_done: list[float] = []

        # Runs before the final iteration's snapshot (snapshots run after the other
        # extensions of their iteration), in both runs of a pair.
        @ppe.training.make_extension(trigger=(steps, "iteration"))
        def mark(manager: Any) -> None:
            last_step_done.append(time.perf_counter())

        with tempfile.TemporaryDirectory() as tmp:
            t = ppe.engine.create_trainer(model, opt, 1, out_dir=tmp, extensions=[mark])
            if writer is not None:
                w = ppe.writing.ThreadWriter() if writer == "thread" else ppe.writing.SimpleWriter()
                t.extend(
                    ppe.training.extensions.snapshot(writer=w, n_retains=1),
                    trigger=(every, "iteration"),
                )
            start = time.perf_counter()
            t.run(data[:steps])
            return time.perf_counter() - start, last_step_done[0] - start

    mb = width * (width + 1) * 4 / 1e6
    run(None)
    ratios: dict[str, list[float]] = {"ThreadWriter": [], "SimpleWriter": []}
    before_flush: list[float] = []
    long_ratios: list[float] = []
    bases: list[float] = []
    repeats = 3 if args.quick else args.repeats
    for _ in range(repeats):
        for name, kind in (("ThreadWriter", "thread"), ("SimpleWriter", "simple")):
            base, base_training = run(None)
            total, training = run(kind)
            ratios[name].append(total / base)
            if kind == "thread":
                before_flush.append(training / base_training)
            bases.append(base)
        if long_run:
            long_base = run(None, long_run)[0]
            long_ratios.append(run("thread", long_run)[0] / long_base)
    report.add(
        "snapshot",
        "no snapshot",
        f"{med_range(bases, 1e3, '{:.0f}')} ms",
        f"{iterations} steps of a {mb:.0f} MB Linear, wall time",
    )
    for name, values in ratios.items():
        report.add(
            "snapshot",
            f"snapshot every {every} it, {name}",
            f"{med_range(values, fmt='{:.3f}')}x",
            f"{iterations // every} snapshots per run, {repeats} pairs; wall time of run(), "
            "including the wait for the last snapshot (taken at the final iteration); "
            "target <= 1.1x"
            + (" (background)" if name == "ThreadWriter" else " (synchronous reference)"),
        )
        if name == "ThreadWriter":
            report.add(
                "snapshot",
                f"snapshot every {every} it, ThreadWriter, to the last step",
                f"{med_range(before_flush, fmt='{:.3f}')}x",
                "the same pairs, each timed to the end of its last training step: the earlier "
                "snapshots' cost to training (host copies, stalls), not the final snapshot",
            )
    if long_run:
        report.add(
            "snapshot",
            f"snapshot every {every} of {long_run} it, ThreadWriter",
            f"{med_range(long_ratios, fmt='{:.3f}')}x",
            f"{long_run // every} snapshots per run, {repeats} pairs against {long_run} steps "
            "without; wall time of run() including the wait for the last snapshot",
        )


def _rss_kb() -> tuple[int, int]:
    """(current RSS, peak RSS) in kB, from /proc (Linux) or getrusage (peak only)."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak, peak


def section_rss(report: Report, args: argparse.Namespace) -> None:
    """RSS growth over many iterations with the standard extensions and a per-step report."""
    import gc

    iterations = 100_000 if args.long else (5_000 if args.quick else 20_000)
    per_epoch = 1000
    # Earlier sections' garbage (the snapshot section's 52 MB models in reference cycles) would
    # otherwise be collected during this run and show as a fall in RSS.
    gc.collect()
    data = batches(per_epoch, seed=2)
    samples: list[tuple[int, int, int]] = []

    @ppe.training.make_extension(trigger=(1000, "iteration"))
    def sample(manager: Any) -> None:
        samples.append((manager.iteration, *_rss_kb()))

    torch.manual_seed(0)
    model = ppe.to(Tiny(ppe.reporting.report), "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with tempfile.TemporaryDirectory() as tmp, _sink() as out:
        t = ppe.engine.create_trainer(
            model,
            opt,
            iterations // per_epoch,
            extensions=[*standard_extensions(ppe, out), sample],
            out_dir=tmp,
        )
        t.run(data)
    # Growth after the first epoch (allocator and caches warm up in it).
    start = next((s for s in samples if s[0] >= 2 * per_epoch), samples[0])
    tail = [s for s in samples if s[0] >= start[0]]
    xs = [s[0] / 1000 for s in tail]
    ys = [s[1] / 1024 for s in tail]
    slope = statistics.linear_regression(xs, ys).slope if len(tail) > 2 else float("nan")
    growth = (samples[-1][1] - start[1]) / 1024
    peak_growth = (samples[-1][2] - start[2]) / 1024
    report.add(
        "rss",
        f"{iterations // 1000}k iterations, 3 ext + report",
        f"{growth:+.2f} MB RSS",
        f"from it {start[0]} to {samples[-1][0]}; peak {peak_growth:+.2f} MB; "
        f"slope {slope * 1024:+.1f} kB per 1k it; target < 10 MB per 100k",
    )


def section_log(report: Report, args: argparse.Namespace) -> None:
    """Per-iteration LogReport at 1k/10k/100k entries, each format (``bench_log.py``)."""
    sys.path.insert(0, HERE)
    import bench_log

    bench_log.section_log(report, args)


def section_tracking(report: Report, args: argparse.Namespace) -> None:
    """MLflowLogger against a local server beside LogReport alone (``bench_log.py``)."""
    sys.path.insert(0, HERE)
    import bench_log

    bench_log.section_tracking(report, args)


def section_dcp(report: Report, args: argparse.Namespace) -> None:
    """Blocked time and host memory per ~150 MB snapshot, DCP and others (``bench_dcp.py``)."""
    sys.path.insert(0, HERE)
    import bench_dcp

    bench_dcp.section_dcp(report, args)


def section_instructions(report: Report, args: argparse.Namespace) -> None:
    """Valgrind instruction counts per step (``bench_step_instructions.py``)."""
    import shutil

    if shutil.which("valgrind") is None:
        report.add("instructions", "all", "n/a", "valgrind not installed")
        return
    sys.path.insert(0, HERE)
    import bench_step_instructions

    for variant, per_step, base in bench_step_instructions.measure():
        value = f"{per_step / 1e3:.1f} k instr/step"
        detail = f"ratio {per_step / base:.3f} (+{(per_step - base) / 1e3:.1f} k)"
        report.add("instructions", variant, value, detail)


def section_gpu(report: Report, args: argparse.Namespace) -> None:
    """Step time with and without asynchronous transfers and prefetching, on a model whose
    step is dominated by the 4 MB host-to-device copy (needs CUDA; one 'n/a' row without)."""
    if not torch.cuda.is_available():
        report.add("gpu", "transfer options", "n/a", "no CUDA device on this machine (skipped)")
        return
    steps = 50 if args.quick else 200
    g = torch.Generator().manual_seed(0)
    host = [
        {"x": torch.randn(256, 4096, generator=g), "t": torch.randint(0, 4, (256,), generator=g)}
        for _ in range(steps)
    ]
    pinned = [{k: v.pin_memory() for k, v in b.items()} for b in host]

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(4096, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
        )

    def raw_cuda(data: list[Batch], non_blocking: bool) -> float:
        m = model().cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for b in data:
            x = b["x"].to("cuda", non_blocking=non_blocking)
            t = b["t"].to("cuda", non_blocking=non_blocking)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), t).backward()
            opt.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / len(data)

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.cross_entropy(self.net(x), t)}

    def ppe_cuda(data: list[Batch], options: dict[str, Any], prefetch: bool = False) -> float:
        m = ppe.to(Wrapped(), "cuda", options=options or None)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        with tempfile.TemporaryDirectory() as tmp:
            t = ppe.engine.create_trainer(
                m, opt, 1, device="cuda", out_dir=tmp, runtime_options=options or None
            )
            loader: Any = data
            if prefetch:  # batch i + 1 copied on a side stream while step i runs
                from ppe_cuda import PrefetchLoader

                loader = PrefetchLoader(data, "cuda")
            torch.cuda.synchronize()
            start = time.perf_counter()
            t.run(loader)
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / len(data)

    raw_cuda(pinned, True)
    report.add("gpu", "raw, pageable, blocking", f"{raw_cuda(host, False) * 1e6:.0f} us/step")
    report.add("gpu", "raw, pinned, non_blocking", f"{raw_cuda(pinned, True) * 1e6:.0f} us/step")
    for name, data, options, prefetch in (
        ("ppe-core cuda, default", host, {}, False),
        ("ppe-core cuda, pinned + non_blocking", pinned, {"non_blocking": True}, False),
        ("ppe-core cuda, pinned + PrefetchLoader", pinned, {}, True),
    ):
        try:
            ppe_cuda(data, options, prefetch)
            us = ppe_cuda(data, options, prefetch) * 1e6
            report.add("gpu", name, f"{us:.0f} us/step", f"{steps} steps, 4 MB batches")
        except Exception as exc:  # an option the installed runtime lacks: say so, go on
            report.add("gpu", name, "n/a", f"{type(exc).__name__}: {exc}"[:120])


def emulated_trainer(data: list[Batch], epochs: int) -> tuple[float, torch.nn.Module]:
    """``create_trainer`` bare on the emulated device (``EmulatedDeviceRuntime``)."""
    from ppe_testing import EMULATED_DEVICE, EmulatedDeviceRuntime

    torch.manual_seed(0)
    model = ppe.to(Tiny(), EMULATED_DEVICE, runtime_class=EmulatedDeviceRuntime)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with tempfile.TemporaryDirectory() as tmp:
        t = ppe.engine.create_trainer(model, opt, epochs, device=EMULATED_DEVICE, out_dir=tmp)
        start = time.process_time()
        t.run(data)
        return time.process_time() - start, model


def enable_emulated() -> str:
    """Enable the emulated device; why it cannot be, or ``""``.

    :func:`main` calls it before the first section: torch's autograd engine takes no new device
    type after a process's first backward, which the other sections run.
    """
    from ppe_core.errors import EmulatedDeviceError

    try:
        from ppe_testing import enable_emulated_device
    except ImportError:
        return "the emulated device is ppe-testing's: pip install -e plugins/ppe_testing"
    try:
        enable_emulated_device()
    except EmulatedDeviceError as exc:
        return str(exc)
    return ""


def section_emulated(report: Report, args: argparse.Namespace) -> None:
    """Per-step cost on the emulated device beside the CPU runtime (what the kit's checks and
    the example plugin pay for leaving the CPU: a Python dispatch per operation)."""
    unavailable = enable_emulated()
    if unavailable:
        report.add("emulated", "emulated device", "skipped", unavailable)
        return
    steps, short, long = (100, 1, 3) if args.quick else (200, 1, 4)
    extra = (long - short) * steps
    data = batches(steps)
    variants: dict[str, Workload] = {
        "cpu runtime": trainer(ppe, extensions=False),
        "emulated device": emulated_trainer,
    }
    per_step: dict[str, list[float]] = {n: [] for n in variants}
    for fn in variants.values():
        fn(data, short)  # warm-up
    models: dict[str, torch.nn.Module] = {}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            v_short, _ = fn(data, short)
            v_long, models[name] = fn(data, long)
            per_step[name].append((v_long - v_short) / extra)
    cpu_weights = {k: v.cpu() for k, v in models["cpu runtime"].state_dict().items()}
    emu_weights = {k: v.cpu() for k, v in models["emulated device"].state_dict().items()}
    same = all(torch.equal(emu_weights[k], cpu_weights[k]) for k in cpu_weights)
    for name, values in per_step.items():
        ratio = [v / c for v, c in zip(values, per_step["cpu runtime"], strict=True)]
        report.add(
            "emulated",
            name,
            f"{med_range(values, 1e6)} us/step",
            f"ratio to cpu {med_range(ratio, fmt='{:.2f}')}"
            + (
                ""
                if name == "cpu runtime"
                else "; weights " + ("bit-identical to cpu" if same else "DIFFER from cpu")
            ),
        )


RUNNERS: dict[str, Callable[[Report, argparse.Namespace], None]] = {
    "step": section_step,
    "eval": section_eval,
    "import": section_import,
    "snapshot": section_snapshot,
    "dcp": section_dcp,
    "rss": section_rss,
    "log": section_log,
    "tracking": section_tracking,
    "instructions": section_instructions,
    "gpu": section_gpu,
    "emulated": section_emulated,
}


def machine() -> str:
    """One line describing where this ran (the numbers mean nothing without it)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {torch.__version__} (1 thread), ppe-core {ppe.__version__}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


def parse(argv: Iterable[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help=f"comma-separated sections of {','.join(SECTIONS)}")
    p.add_argument("--quick", action="store_true", help="fewer steps; skips 'instructions'")
    p.add_argument("--long", action="store_true", help="rss over 100k iterations")
    p.add_argument("--repeats", type=int, default=5, help="pairs per variant (>= 5 for medians)")
    p.add_argument(
        "--paired-steps",
        type=int,
        default=None,
        help="timed steps of each paired run in 'tracking' (default 2000, --quick 1000)",
    )
    return p.parse_args(list(argv) if argv is not None else None)


def main(argv: Iterable[str] | None = None) -> Report:
    args = parse(argv)
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"unknown section(s) {', '.join(unknown)}; choose from {SECTIONS}")
    if not wanted:
        wanted = [s for s in SECTIONS if not (args.quick and s == "instructions")]
    torch.set_num_threads(1)
    if "emulated" in wanted:
        enable_emulated()  # before any section's first backward (see enable_emulated)
    report = Report()
    print(f"machine: {machine()}", flush=True)
    started = time.perf_counter()
    for section in SECTIONS:
        if section in wanted:
            print(f"-- {section}", flush=True)
            RUNNERS[section](report, args)
    print(f"\nmachine: {machine()}")
    print(f"command: python -m benchmarks {' '.join(sys.argv[1:])}".rstrip())
    print(f"took {time.perf_counter() - started:.0f} s\n")
    print(report.table())
    return report


if __name__ == "__main__":
    main()
