"""Kiln's start-up shim: with this folder on PYTHONPATH and KILN_TUNE=1, kiln.tune's JIT hook is
installed as soon as the process imports torch (``python -m kiln.tune.run --site-dir`` prints the
folder). Nothing is imported before that, so processes that never use torch pay nothing. Any other
sitecustomize on the path (which this one shadows) is run afterwards."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))


def _install() -> None:
    try:
        from kiln.tune.hook import install_from_env

        if not install_from_env():
            sys.stderr.write("kiln.tune: KILN_TUNE=1, but the hook is not installed (see the error above)\n")
    except Exception as err:  # noqa: BLE001 - a start-up hook must not break the program
        sys.stderr.write(f"kiln.tune: KILN_TUNE=1, but kiln.tune cannot be imported ({type(err).__name__}: {err})\n")


class _Loader(importlib.abc.Loader):
    """Runs torch's own loader (put back in torch's module attributes first), then the hook."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self.inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        _install()


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def _run_next_sitecustomize() -> None:
    path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None and spec.origin != __file__:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("KILN_TUNE", "").strip().lower() in {"1", "true", "yes", "on"}:
    if "torch" in sys.modules:
        _install()
    else:
        sys.meta_path.insert(0, _AfterTorch())
_run_next_sitecustomize()
