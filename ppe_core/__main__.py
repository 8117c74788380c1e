"""``python -m ppe_core plugins|info|export-snapshot``: what is installed, the environment it
sees, and a sharded snapshot exported to one ordinary state_dict file."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from ppe_core._plugins import PluginHost, get_plugin_host
from ppe_core._registry import Registry, describe
from ppe_core._version import __version__


def _registry_rows(registry: Registry[Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "object": describe(e.obj),
            "plugin": e.registrant.plugin,
            "distribution": e.registrant.distribution,
            "version": e.registrant.version,
        }
        for name, e in sorted(registry.entries().items())
    ]


def plugins_report(host: PluginHost) -> dict[str, Any]:
    """Everything ``plugins`` prints, as JSON-ready data."""
    return {
        "ppe_core": __version__,
        "plugins": [r.as_dict() for r in host.records.values()],
        "runtimes": _registry_rows(host.runtimes),
        "logics": _registry_rows(host.logics),
        "extensions": _registry_rows(host.extensions),
    }


def _print_plugins(report: dict[str, Any]) -> None:
    print(f"ppe-core {report['ppe_core']}")
    print("\nplugins:")
    for p in report["plugins"]:
        kind = "built-in" if p["builtin"] else p["source"]
        dist = f"{p['distribution']} {p['version']}" if p["distribution"] else "-"
        print(f"  {p['name']:<24} {p['status']:<8} {kind:<12} {dist:<24} {p['module'] or '-'}")
        if p["error"]:
            print(f"      error: {p['error']}")
    for section in ("runtimes", "logics", "extensions"):
        print(f"\n{section}:")
        if not report[section]:
            print("  (none)")
        for row in report[section]:
            dist = f", {row['distribution']} {row['version']}" if row["distribution"] else ""
            print(f"  {row['name']:<24} {row['object']}  [{row['plugin']}{dist}]")


def info_lines(host: PluginHost) -> list[str]:
    """Versions and every plugin's ``ppe_environment_info`` lines."""
    import pluggy
    import torch

    lines = [
        f"ppe-core: {__version__}",
        f"python: {platform.python_version()} ({sys.executable})",
        f"platform: {platform.platform()}",
        f"torch: {torch.__version__}",
        f"pluggy: {pluggy.__version__}",
    ]
    loaded = [r for r in host.records.values() if r.status == "loaded" and not r.builtin]
    lines += [
        f"plugin {r.name}: {r.distribution or r.module} {r.version or ''}".rstrip() for r in loaded
    ]
    lines += [f"plugin {r.name}: FAILED {r.error}" for r in host.failures]
    return lines + host.environment_info()


#: The help's description: plain text (the module docstring's reST markup would show as is).
DESCRIPTION = (
    "What is installed (plugins, runtimes, logics, extensions) and the environment it sees; "
    "export-snapshot writes a model of a snapshot as one state_dict file."
)


def _program_name() -> str:
    """``ppe-core`` when run as the console script, else ``python -m ppe_core``."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "ppe-core" if script.startswith("ppe-core") else "python -m ppe_core"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m ppe_core`` and the ``ppe-core`` script."""
    parser = argparse.ArgumentParser(prog=_program_name(), description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"ppe-core {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    plugins = sub.add_parser("plugins", help="list plugins, runtimes, logics and extensions")
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub.add_parser("info", help="print versions and each plugin's environment info")
    export = sub.add_parser(
        "export-snapshot",
        help="write a model of a snapshot (a file, or a SnapshotMode.DCP directory) as one "
        "ordinary state_dict file",
        description=(
            "Verifies the snapshot against its manifest (a DCP directory: every rank's shards "
            "joined into full tensors) and saves one model's weights with torch.save as a "
            "plain state dict: model.load_state_dict(torch.load(OUTPUT)) restores them. "
            "Refuses a snapshot that does not verify (damaged, or a DCP directory without a "
            "manifest: unfinished); a snapshot file without a manifest (written by PPE) is "
            "exported marked unverified."
        ),
    )
    export.add_argument(
        "snapshot", help="the snapshot file or DCP directory, e.g. result/snapshot_iter_12"
    )
    export.add_argument("output", help="the file to write, e.g. model.pt")
    export.add_argument(
        "--model", default=None, help="the trainer's name of the model (default: the only one)"
    )
    args = parser.parse_args(argv)

    if args.command == "export-snapshot":
        return _export(export, args)
    host = get_plugin_host()
    if args.command == "plugins":
        report = plugins_report(host)
        if args.json:
            json.dump(report, sys.stdout, indent=2)
            print()
        else:
            _print_plugins(report)
    else:
        print("\n".join(info_lines(host)))
    return 0


def _export(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``export-snapshot``: 0 when written (a snapshot without a manifest, written by PPE, is
    written marked unverified on stderr); 1, with the reason (one line) on stderr, when
    refused: a path not found, a snapshot that does not verify, or an output that cannot be
    written (a missing or unwritable directory, a full disk, a path inside the snapshot)."""
    import ppe_core.training.extensions
    from ppe_core.errors import PPEError, SnapshotVerificationWarning

    try:
        # The snapshot family is ppe-extensions'; without it this names the package to install.
        export_snapshot = ppe_core.training.extensions.export_snapshot
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SnapshotVerificationWarning)
            weights = export_snapshot(args.snapshot, args.output, model=args.model)
    except PPEError as exc:
        print(f"{parser.prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    for warning in caught:
        if isinstance(warning.message, SnapshotVerificationWarning):
            print(f"{parser.prog}: warning: {warning.message}", file=sys.stderr)
        else:  # not ours to swallow
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    unverified = any(isinstance(w.message, SnapshotVerificationWarning) for w in caught)
    size = sum(t.numel() * t.element_size() for t in weights.values())
    note = " (unverified: the snapshot has no manifest)" if unverified else ""
    print(f"wrote {args.output}: {len(weights)} tensors, {size / 1e6:.1f} MB{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
