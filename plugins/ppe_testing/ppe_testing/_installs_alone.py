"""check_installs_alone: a package installed alone beside ppe-core in a new venv, its tests run.

A development environment has every package at once, so a package that imports something only
another package brings (a first-party plugin, numpy through mlflow) passes its tests there and
fails for a user who installs it alone. This check installs ppe-core and the one package into
a new virtual environment with pip, the way a user does, and runs the package's tests there.

ppe-core's own environment (ppe-core, its dependencies and pytest: torch alone is most of an
install's time) is built once per process and shared: each package gets a new venv of its own
that sees the core's through a ``.pth`` file, as a venv made with ``--system-site-packages``
sees the system's, and pip installs into the package's venv only what the core's lacks.
Packages checked in one process never see each other. pip does not byte-compile what it
installs (most of torch's install time); Python caches the bytecode of what is imported, in a
folder beside the core's venv.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["check_installs_alone"]

#: Seconds one pip install, or one run of the package's tests, may take.
_TIMEOUT = 900

#: Prints, for each module named on the command line, whether it is importable.
_IMPORTABLE = (
    "import importlib.util as u, sys; print(*(bool(u.find_spec(m)) for m in sys.argv[1:]))"
)

#: The core environments built in this process: a digest of what they hold -> their folder.
_CORE_ENVIRONMENTS: dict[str, Path] = {}


def check_installs_alone(
    project: str | os.PathLike[str],
    tests: Sequence[str | os.PathLike[str]],
    *,
    core: str | os.PathLike[str],
    workdir: str | os.PathLike[str],
    constraints: str | os.PathLike[str] | None = None,
    absent: Sequence[str] = (),
    extras: Sequence[str] = (),
    dependencies: Sequence[str | os.PathLike[str]] = (),
) -> str:
    """Installs the package at ``project`` alone beside ppe-core and runs its ``tests`` there.

    Args:
        project: the package's project folder (its ``pyproject.toml``), installed editable.
        tests: test files or folders to run with pytest, relative to ``project`` (or
            absolute); they must pass with nothing installed but ppe-core, the package, their
            dependencies and pytest.
        core: ppe-core's project folder (a checkout), installed editable, or a requirement
            such as ``"ppe-core==0.1.0"``.
        workdir: an empty folder for the package's venv (pytest's ``tmp_path``).
        constraints: a pip constraints file for both installs (pinned versions install
            without backtracking, from a local wheel where one is found).
        absent: modules that must not be importable in the new venv, to show that it is
            really alone (another package's module, a dependency the package must not need).
        extras: the package's optional-dependency groups to install with it.
        dependencies: what the package requires that no package index has (another local
            project's folder, installed editable, as ``core``), installed with it.

    Returns:
        The tests' output (pytest's ``-q`` report).

    Raises:
        AssertionError: an install failed, a module of ``absent`` was importable, or the
            tests failed or ran none; the message holds the end of pip's or pytest's output.

    Example, in the package's own tests::

        @pytest.mark.slow
        def test_the_package_installs_alone(tmp_path):
            check_installs_alone(
                PROJECT, ["tests/test_mine.py"], core="ppe-core", workdir=tmp_path
            )
    """
    project, workdir = Path(project).resolve(), Path(workdir).resolve()
    constraint_args = ["-c", str(Path(constraints).resolve())] if constraints else []
    core_root = _core_environment(core, constraint_args)
    env = _environment(core_root)
    python = _package_environment(core_root, workdir / "venv")
    name = project.name
    requirements = [arg for dependency in dependencies for arg in _requirement(dependency)]
    requirements += ["-e", str(project) + _extras(extras)]
    _pip(python, [*constraint_args, *requirements], name, env)
    if absent:
        found = subprocess.run(
            [python, "-c", _IMPORTABLE, *absent],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            cwd=workdir,  # not a checkout's root, whose folders would be importable
            env=env,
        )
        importable = dict(zip(absent, found.stdout.split(), strict=True))
        present = [module for module, there in importable.items() if there == "True"]
        assert not present, f"{name} was installed beside {present}, which should be absent"
    result = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, tests)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        check=False,
    )
    report = result.stdout[-3000:] + result.stderr[-2000:]
    assert result.returncode == 0, f"{name}'s tests failed installed alone:\n{report}"
    # Exit status 0 means nothing failed (and 5, no test collected, was refused above); the
    # summary is the last line (test names above it may hold the word "failed").
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert " passed" in summary, report
    return result.stdout


def _core_environment(core: str | os.PathLike[str], constraint_args: list[str]) -> Path:
    """A folder with a venv (``venv``) of ppe-core and pytest, built once per process."""
    requirement = _requirement(core)
    digest = hashlib.sha256(repr((sys.executable, requirement)).encode())
    for argument in constraint_args[1:]:
        digest.update(Path(argument).read_bytes())
    key = digest.hexdigest()
    root = _CORE_ENVIRONMENTS.get(key)
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="ppe-core-environment-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        python = _venv(root / "venv", with_pip=True)
        _pip(python, [*constraint_args, *requirement, "pytest"], "ppe-core", _environment(root))
        _CORE_ENVIRONMENTS[key] = root
    return root


def _environment(core_root: Path) -> dict[str, str]:
    """The environment of every command run in the venvs.

    pip installs without byte-compiling (``--no-compile``: compiling all of torch is most of
    its install time); Python writes the bytecode of what is imported on first import
    instead, under ``core_root`` (``PYTHONPYCACHEPREFIX``: never into a checkout), so later
    commands and packages reuse it. pytest's variables of an outer run are dropped.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PYTEST_") and key != "PYTHONDONTWRITEBYTECODE"
    }
    env["PYTHONPYCACHEPREFIX"] = str(core_root / "pycache")
    return env


def _package_environment(core_root: Path, venv: Path) -> str:
    """A new venv that sees the core's site-packages after its own; its python."""
    python = _venv(venv, with_pip=False)  # pip comes from the core's environment
    # A .pth line starting with "import" runs at startup; addsitedir also reads the core's
    # .pth files (its editable installs).
    core_site = str(_site_packages(core_root / "venv"))
    line = f"import site; site.addsitedir({core_site!r})\n"
    (_site_packages(venv) / "_ppe_core_environment.pth").write_text(line)
    return python


def _requirement(project: str | os.PathLike[str]) -> list[str]:
    """pip's arguments for a project folder (editable) or a requirement."""
    return ["-e", str(Path(project).resolve())] if Path(project).is_dir() else [str(project)]


def _extras(extras: Sequence[str]) -> str:
    return f"[{','.join(extras)}]" if extras else ""


def _venv(path: Path, *, with_pip: bool) -> str:
    command = [sys.executable, "-m", "venv", str(path)]
    subprocess.run(command if with_pip else [*command, "--without-pip"], check=True, timeout=120)
    return str(path / "bin" / "python")


def _site_packages(venv: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))


def _pip(python: str, arguments: list[str], what: str, env: dict[str, str]) -> None:
    command = [python, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
    command += arguments
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=_TIMEOUT, check=False, env=env
    )
    assert done.returncode == 0, f"pip could not install {what}:\n{done.stderr[-2000:]}"
