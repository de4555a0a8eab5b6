"""scikit-build-core metadata provider: pin ``torch`` to the version we compile against.

The C++ layer links against the LibTorch shipped inside the ``torch`` wheel, whose C++ ABI
changes between releases, so the wheel we produce must require exactly that release.
"""

from __future__ import annotations

import pathlib
import re
from importlib import metadata


def default_torch_pin() -> str:
    """The project's one torch pin, "torch==X.Y.Z", from pyproject.toml's build requirements."""
    text = (pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    return re.search(r'"(torch==[^"]+)"', text).group(1)


def _public_version(version: str) -> str:
    # "X.Y.Z+cpu" -> "X.Y.Z": the local label names the build flavour, which pip's
    # "==" ignores when the requirement carries none.
    return version.split("+", 1)[0]


def dynamic_metadata(field, settings=None, project=None):
    if field != "dependencies":
        raise RuntimeError(f"ftorch_build_meta only provides 'dependencies', not {field!r}")
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            "torch must be installed in the build environment: the C++ layer is compiled "
            f"against its LibTorch (pip install {default_torch_pin()}, then build with "
            "--no-build-isolation)"
        ) from exc
    return [f"torch=={_public_version(torch_version)}"]


def get_requires_for_dynamic_metadata(settings=None):
    return []
