"""The import-time check that the CUDA libraries loaded are the ones kiln._C was built against.

A process loads one copy of each library (by soname), whichever comes first: PyTorch's wheels,
the CUDA toolkit, or a folder on LD_LIBRARY_PATH. kiln._C reports, per library, the version its
headers declared and the version of the copy loaded (``kiln._C.build_info()``). Another major
version is an ImportError; an older minor version than the headers is a warning, since Kiln may
then ask the library for something it lacks.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

log = logging.getLogger("kiln")


def _major_minor(name: str, version: int) -> tuple[int, int]:
    if name in ("cudart", "nvrtc"):  # major * 1000 + minor * 10
        return version // 1000, version % 1000 // 10
    return version // 10000, version % 10000 // 100  # cuBLASLt, cuDNN: major * 10000 + minor * 100 + patch


def library_version_problems(libraries: list[dict[str, Any]]) -> list[str]:
    """One line per library whose loaded copy is of another major version or older than the headers."""
    problems = []
    for lib in libraries:
        if not lib["built"] or not lib["loaded"]:
            continue
        built = _major_minor(lib["name"], lib["built"])
        loaded = _major_minor(lib["name"], lib["loaded"])
        what = (f"{lib['name']}: kiln._C was built against {built[0]}.{built[1]}, but this process "
                f"loaded {loaded[0]}.{loaded[1]} from {lib['file'] or 'an unknown file'}")
        if loaded[0] != built[0]:
            problems.append(what + " (another major version)")
        elif loaded < built:
            problems.append(what + " (older than the headers)")
    return problems


def check_build(build_info: dict[str, Any]) -> None:
    """Raises ImportError for a library of another major version, warns for an older one."""
    problems = library_version_problems(build_info["libraries"])
    fatal = [p for p in problems if p.endswith("(another major version)")]
    if fatal:
        raise ImportError("; ".join(fatal) + ". Rebuild Kiln in this environment (pip install .), or load "
                          "the libraries it was built against first; see docs/install.md.")
    for problem in problems:
        warnings.warn(f"kiln: {problem}; rebuild Kiln in this environment if CUDA engines fail", RuntimeWarning,
                      stacklevel=3)
