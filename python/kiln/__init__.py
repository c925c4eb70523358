"""Kiln: an inference compiler and runtime for PyTorch.

This package re-exports the core C++ API from the ``kiln._C`` extension: the IR (``Graph``),
the builder (``BuilderConfig``, ``Builder``), engines and execution contexts, the ATen import
description, and the exception classes. The core needs only numpy; the torch front end lives
in the other modules of this package.

Exceptions (the C++ ``kiln::ErrorCode`` each stands for; every one is a ``KilnError``, itself a
``RuntimeError``)::

    InvalidArgumentError  (ValueError)          invalid_argument
    UnsupportedError      (NotImplementedError) unsupported
    ShapeMismatchError    (ValueError)          shape_mismatch
    EngineFileError       a damaged or foreign engine file, one of:
        TruncatedError, CorruptedError, VersionMismatchError, DeviceMismatchError
    IoError               (OSError)             io
    InternalError                               internal (a bug in Kiln)

An exception's ``code`` attribute is its ``ErrorCode``; its message is the C++ message.
"""

from __future__ import annotations

from ._build import check_build as _check_build
from ._build import library_version_problems
from ._C import (
    Builder,
    BuilderConfig,
    BuildPolicy,
    CorruptedError,
    DeviceMismatchError,
    Dim,
    DType,
    Engine,
    EngineFileError,
    ErrorCode,
    ExecutionContext,
    Graph,
    ImportArg,
    ImportArgKind,
    ImportConstant,
    ImportGraph,
    ImportNode,
    ImportSupport,
    ImportTensor,
    InternalError,
    InvalidArgumentError,
    IoError,
    IOTensor,
    KilnError,
    Node,
    Refitter,
    ShapeMismatchError,
    TensorType,
    TruncatedError,
    UnsupportedError,
    Value,
    VersionMismatchError,
    __version__,
    build_info,
    can_import,
    cuda_available,
    dtype_from_name,
    dtype_from_numpy,
    dtype_size,
    dtype_to_numpy,
    import_aten,
    is_floating,
    is_integral,
    op_family,
    op_names,
    supported_aten_targets,
)

_check_build(build_info())

__all__ = [
    "BuildPolicy",
    "Builder",
    "BuilderConfig",
    "CorruptedError",
    "DeviceMismatchError",
    "Dim",
    "DType",
    "Engine",
    "EngineFileError",
    "ErrorCode",
    "ExecutionContext",
    "Graph",
    "ImportArg",
    "ImportArgKind",
    "ImportConstant",
    "ImportGraph",
    "ImportNode",
    "ImportSupport",
    "ImportTensor",
    "InternalError",
    "InvalidArgumentError",
    "IoError",
    "IOTensor",
    "KilnError",
    "Node",
    "Refitter",
    "ShapeMismatchError",
    "TensorType",
    "TruncatedError",
    "UnsupportedError",
    "Value",
    "VersionMismatchError",
    "__version__",
    "build_info",
    "can_import",
    "cuda_available",
    "dtype_from_name",
    "dtype_from_numpy",
    "dtype_size",
    "dtype_to_numpy",
    "import_aten",
    "is_floating",
    "is_integral",
    "library_version_problems",
    "op_family",
    "op_names",
    "supported_aten_targets",
]

# ---- the PyTorch front end ----------------------------------------------------------------
# Loaded only when torch is importable, so that the core stays usable without it.
try:
    import torch as _torch  # noqa: F401
except ImportError:  # pragma: no cover - core-only installs
    pass
else:
    from .aot import DynamicProgram, compile, extract_engines, load, save
    from .archive import UnsafeFileError
    from .cache import DiskEngineCache, EngineCache
    from .dynamic import Input, ShapeRangeError
    from .dynamo import kiln_backend
    from .mutable import MutableModule
    from .refit import refit  # the function; "from kiln.refit import ..." still reaches the module
    from .settings import CompilationSettings

    def _register_backend() -> None:
        """Registers "kiln" with Dynamo unless the installed entry point will (both would clash)."""
        from importlib.metadata import entry_points

        from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

        declared = any(ep.name == "kiln" for ep in entry_points(group="torch_dynamo_backends"))
        if not declared and "kiln" not in _COMPILER_FNS:
            register_backend(compiler_fn=kiln_backend, name="kiln")

    _register_backend()
    from . import tune  # after the backend is registered: KILN_TUNE=1 installs its hook on import

    __all__ += ["CompilationSettings", "DiskEngineCache", "DynamicProgram", "EngineCache", "Input", "MutableModule",
                "ShapeRangeError", "UnsafeFileError", "compile", "extract_engines", "kiln_backend", "load", "refit",
                "save", "tune"]
