"""``ppe.requires``: is an installed distribution at least a given version?"""

from __future__ import annotations

import importlib.metadata
import re

__all__ = ["requires"]

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(.*)$")


def _release_key(version: str) -> tuple[tuple[int, ...], bool]:
    """Returns ``(release numbers, is_final)``; a pre-/dev-release sorts before its final."""
    match = _RELEASE.match(version)
    if match is None:
        raise ValueError(f"cannot parse version {version!r}; expected e.g. '2.1' or '2.1.0'")
    numbers = tuple(int(part) for part in match.group(1).split("."))
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers = numbers[:-1]
    suffix = match.group(2).lstrip(".-_").lower()
    is_final = not suffix or suffix.startswith("post")
    return numbers, is_final


def requires(version: str, package: str = "torch") -> bool:
    """Tells whether the installed ``package`` is at least ``version`` (PPE's ``ppe.requires``).

    Like PPE, the local part (``+cpu``) and anything after a ``-`` of the installed version
    are ignored, so ``torch 2.1.0+cu121`` satisfies ``requires("2.1.0")``. Typical use is a
    feature switch: ``if ppe.requires("2.0.0"): model = torch.compile(model)``.

    Args:
        version: The minimum version, e.g. ``"2.0.0"``.
        package: Distribution name to check; PyTorch by default. ``"ppe-core"`` checks
            ppe-core itself, whose PPE-compatible API level is ``pytorch-pfn-extras`` 0.9.

    Returns:
        True when the installed version is greater than or equal to ``version``.

    Raises:
        importlib.metadata.PackageNotFoundError: ``package`` is not installed (as in PPE).
        ValueError: ``version`` is not a version number.
    """
    installed = importlib.metadata.version(package).split("+")[0].split("-")[0]
    try:
        from packaging.version import Version
    except ImportError:  # packaging is optional; compare the release numbers ourselves
        return _release_key(installed) >= _release_key(version)
    return Version(installed) >= Version(version)
