"""The installed package's build: one C++ runtime per process, matching CUDA library versions,
and `python -m kiln.check` run the way a user runs it (docs/install.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kiln
from kiln._build import library_version_problems

LIBRARY_SOURCE = r"""
#include <stdexcept>
#include <string>
extern "C" int probe(int n) {
  try { throw std::runtime_error(std::string(static_cast<size_t>(n), 'x')); }
  catch (const std::exception& e) { return int(std::string(e.what()).size()); }
}
"""


def shared_library(tmp_path: Path, name: str, *flags: str) -> str:
    """A small C++ shared library built with the system compiler and `flags`."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++ to build a test library with")
    source = tmp_path / "probe.cpp"
    source.write_text(LIBRARY_SOURCE)
    out = tmp_path / name
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(out), str(source), *flags], check=True)
    return str(out)


def test_extension_uses_the_process_cxx_runtime() -> None:
    info = kiln.build_info()
    library = os.path.realpath(kiln._C.__file__)
    assert info["library"] == library
    assert "libstdc++.so" in os.path.basename(info["cxx_runtime"]), info
    assert info["cxx_runtime"] == info["process_cxx_runtime"]
    assert info["compiler"], info
    kiln._C.check_cxx_runtime(library)  # what the import ran: raises on a second runtime


def test_a_static_cxx_runtime_is_found_and_refused(tmp_path: Path) -> None:
    static = shared_library(tmp_path, "libstatic.so", "-static-libstdc++")
    shared = shared_library(tmp_path, "libshared.so")
    assert kiln._C.cxx_runtime_of(static) == os.path.realpath(static)
    assert kiln._C.cxx_runtime_of(shared) == kiln.build_info()["process_cxx_runtime"]
    with pytest.raises(RuntimeError, match="carries its own copy of the C\\+\\+ runtime"):
        kiln._C.check_cxx_runtime(static)
    kiln._C.check_cxx_runtime(shared)


def test_library_versions_are_reported_and_checked() -> None:
    libraries = kiln.build_info()["libraries"]
    for lib in libraries:  # the CUDA backend's, where this build has it
        assert lib["built"] > 0 and lib["loaded"] > 0, lib
        assert os.path.exists(lib["file"]), lib
    assert kiln.library_version_problems(libraries) == []


@pytest.mark.parametrize(("name", "built", "loaded", "problem"), [
    ("cudnn", 91900, 91900, None),
    ("cudnn", 91300, 91900, None),  # newer minor than the headers: compatible
    ("cudnn", 91900, 91300, "older than the headers"),
    ("cudnn", 91900, 80900, "another major version"),
    ("cublasLt", 130100, 120900, "another major version"),
    ("cudart", 13000, 12080, "another major version"),
    ("nvrtc", 13010, 13000, "older than the headers"),
])
def test_version_rules(name: str, built: int, loaded: int, problem: str | None) -> None:
    found = library_version_problems([{"name": name, "built": built, "loaded": loaded, "file": "/x/lib.so"}])
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].endswith(f"({problem})") and "/x/lib.so" in found[0], found


def test_another_major_version_fails_the_import_check() -> None:
    from kiln._build import check_build

    libraries = [{"name": "cudnn", "built": 91900, "loaded": 80900, "file": "/x/libcudnn.so.8"}]
    with pytest.raises(ImportError, match="cudnn: kiln._C was built against 9.19, but this process loaded 8.9"):
        check_build({"libraries": libraries})
    with pytest.warns(RuntimeWarning, match="older than the headers"):
        check_build({"libraries": [{"name": "cudnn", "built": 91900, "loaded": 91300, "file": "/x/l.so"}]})


def test_smoke_check_from_outside_the_source_tree(tmp_path: Path) -> None:
    """`python -m kiln.check` in a folder of its own: both paths, a torchvision and a transformers model."""
    proc = subprocess.run([sys.executable, "-m", "kiln.check", "--device", "cpu", "--models", "resnet18,bert"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "4 passed, 0 failed" in report, report
    assert "C++ runtime: " in report and "libstdc++" in report, report


def test_smoke_check_reports_a_failure(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "kiln.check", "--device", "cpu", "--models", "nosuchmodel"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown model or path ['nosuchmodel']" in proc.stderr
