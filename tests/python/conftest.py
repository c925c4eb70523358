"""Shared setup of the Python tests.

The tests import the installed ``kiln`` package. For a development tree, build ``kiln._C`` in a
CMake build directory and either set ``PYTHONPATH=<repo>/python`` with the built ``_C*.so``
linked into ``python/kiln/``, or ``pip install --no-build-isolation -e .``. When ``kiln`` is not
importable at all, the repository's ``python/`` folder is tried so that the error names the
missing extension rather than the package.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("kiln") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device and a Kiln built with the CUDA backend; "
                            "skipped where there is none")


def _cuda_ready() -> bool:
    import torch

    import kiln

    return kiln.cuda_available() and torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test marked ``cuda`` (a module's ``pytestmark`` or one parameter's ``marks``) is
    skipped unless Kiln has its CUDA backend and PyTorch sees a GPU; ``-m cuda`` still selects them."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked or _cuda_ready():
        return
    skip = pytest.mark.skip(reason="Kiln was built without CUDA, or no GPU is present")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def rng():
    """A seeded numpy generator, so that every run sees the same random (non-zero) data."""
    import numpy as np

    return np.random.default_rng(20240611)
