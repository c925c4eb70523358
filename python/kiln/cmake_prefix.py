"""Where the installed Kiln C++ package is, for CMake's find_package(Kiln).

    cmake -S app -B build -DCMAKE_PREFIX_PATH="$(python -m kiln.cmake_prefix)"

The wheel installs the headers, the core library and the package config inside the Python
package: ``<site-packages>/kiln/{include,lib,lib/cmake/Kiln}`` (docs/deploy.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["cmake_prefix_path"]


def cmake_prefix_path() -> str:
    """The folder to put on CMAKE_PREFIX_PATH for ``find_package(Kiln)``. Raises FileNotFoundError
    when this kiln has no C++ package (one run from a source tree rather than installed)."""
    prefix = Path(__file__).resolve().parent
    config = prefix / "lib" / "cmake" / "Kiln" / "KilnConfig.cmake"
    if not config.is_file():
        raise FileNotFoundError(f"kiln at {prefix} has no C++ package ({config} is missing): install Kiln with pip "
                                f"(scripts/install.sh) to get it")
    return str(prefix)


def main() -> int:
    try:
        print(cmake_prefix_path())
    except FileNotFoundError as err:
        print(f"kiln.cmake_prefix: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
