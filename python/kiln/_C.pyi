"""Kiln core bindings: IR, builder, engine and runtime, ATen import.

Type stub of the kiln._C extension (src/python/*.cpp). Regenerate with
``python -m nanobind.stubgen -m kiln._C`` and keep the exception classes written out below;
tests/python/test_core_bindings.py checks that every public name of the module is here.
"""

from collections.abc import Mapping, Sequence
import enum
import os
from typing import Annotated, Any, overload

import numpy
import numpy.typing
from numpy.typing import NDArray


class ErrorCode(enum.Enum):
    """What kind of failure a KilnError reports."""

    invalid_argument = 0

    unsupported = 1

    shape_mismatch = 2

    truncated = 3

    corrupted = 4

    version_mismatch = 5

    device_mismatch = 6

    io = 7

    internal = 8

# The exception classes are created by the extension with __module__ "kiln" (the package
# re-exports them); see src/python/module.cpp for the ErrorCode of each.
class KilnError(RuntimeError):
    code: ErrorCode

class InvalidArgumentError(KilnError, ValueError): ...

class UnsupportedError(KilnError, NotImplementedError): ...

class ShapeMismatchError(KilnError, ValueError): ...

class EngineFileError(KilnError): ...

class TruncatedError(EngineFileError): ...

class CorruptedError(EngineFileError): ...

class VersionMismatchError(EngineFileError): ...

class DeviceMismatchError(EngineFileError): ...

class IoError(KilnError, OSError): ...

class InternalError(KilnError): ...

__version__: str

class DType(enum.Enum):
    """Element types of Kiln tensors."""

    f32 = 0

    f16 = 1

    bf16 = 2

    f64 = 3

    i64 = 4

    i32 = 5

    i8 = 6

    u8 = 7

    bool = 8

def build_info() -> dict[str, Any]:
    """
    How this extension was built: the compiler, the C++ runtime it uses and the process's, and per backend library (CUDA: cudart, cublasLt, nvrtc, cudnn) the version built against, the version loaded and its file.
    """

def cxx_runtime_of(library: str) -> str:
    """
    The file a shared library resolves the C++ runtime from: itself when it carries a static copy, '' when it uses none.
    """

def check_cxx_runtime(library: str) -> None:
    """
    Raises RuntimeError when a shared library carries its own C++ runtime or uses another one than this process has loaded; the import of kiln._C runs it on itself.
    """

def dtype_size(dtype: DType) -> int:
    """Bytes per element."""

def dtype_from_name(name: str) -> DType:
    """
    'f32', 'f16', ... -> DType; raises InvalidArgumentError naming the valid names.
    """

def is_floating(dtype: DType) -> bool: ...

def is_integral(dtype: DType) -> bool: ...

def dtype_from_numpy(dtype: numpy.typing.DTypeLike) -> DType:
    """
    Anything numpy.dtype() accepts -> DType; raises UnsupportedError when Kiln has no such dtype.
    """

def dtype_to_numpy(dtype: DType) -> numpy.dtype:
    """DType -> numpy.dtype; raises UnsupportedError for bf16."""

def op_names() -> list[str]:
    """Every Kiln op, in the order of KILN_OP_LIST."""

def op_family(op: str) -> str:
    """
    The family of an op ('unary', 'binary', ...), as in include/kiln/ops.h.
    """

class Dim:
    """
    One dimension: a concrete extent, optionally a symbol with a [min, max] range.
    """

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, extent: int, symbol: str = '', min: int = 0, max: int = 0) -> None: ...

    @property
    def extent(self) -> int: ...

    @extent.setter
    def extent(self, arg: int, /) -> None: ...

    @property
    def symbol(self) -> str: ...

    @symbol.setter
    def symbol(self, arg: str, /) -> None: ...

    @property
    def min(self) -> int: ...

    @min.setter
    def min(self, arg: int, /) -> None: ...

    @property
    def max(self) -> int: ...

    @max.setter
    def max(self, arg: int, /) -> None: ...

    @property
    def is_static(self) -> bool: ...

    def __eq__(self, arg: Dim, /) -> bool: ...

    def __repr__(self) -> str: ...

class TensorType:
    """A dtype and dims."""

    def __init__(self, dtype: DType, shape: Sequence[int]) -> None: ...

    @staticmethod
    def from_dims(dtype: DType, dims: Sequence[Dim]) -> TensorType:
        """A type with symbolic dims."""

    @property
    def dtype(self) -> DType: ...

    @dtype.setter
    def dtype(self, arg: DType, /) -> None: ...

    @property
    def dims(self) -> list[Dim]: ...

    @dims.setter
    def dims(self, arg: Sequence[Dim], /) -> None: ...

    @property
    def shape(self) -> list[int]: ...

    @property
    def rank(self) -> int: ...

    @property
    def numel(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def __eq__(self, arg: TensorType, /) -> bool: ...

    def __str__(self) -> str: ...

    def __repr__(self) -> str: ...

class Value:
    """A snapshot of one value of a graph (Graph.value)."""

    @property
    def type(self) -> TensorType: ...

    @property
    def name(self) -> str: ...

    @property
    def is_input(self) -> bool: ...

    @property
    def is_weight(self) -> bool: ...

    @property
    def is_constant(self) -> bool: ...

    def __repr__(self) -> str: ...

class Node:
    """A view of one node; keeps its graph alive."""

    @property
    def op(self) -> str: ...

    @property
    def inputs(self) -> list[int | None]:
        """Input value ids; None for an absent optional input."""

    @property
    def outputs(self) -> list[int]: ...

    @property
    def attrs(self) -> dict[str, object]: ...

    @property
    def name(self) -> str: ...

    @property
    def body(self) -> Graph | None:
        """The body graph of a fused node, else None."""

    def __repr__(self) -> str: ...

class Graph:
    """A Kiln IR graph: build it, then hand it to a Builder."""

    def __init__(self) -> None: ...

    def copy(self) -> Graph:
        """A deep copy (constant bytes are shared)."""

    def __copy__(self) -> Graph: ...

    def __deepcopy__(self, memo: object) -> Graph: ...

    @overload
    def add_input(self, name: str, dtype: DType, shape: Sequence[int]) -> int:
        """A runtime input; returns its value id."""

    @overload
    def add_input(self, name: str, type: TensorType) -> int:
        """A runtime input of a given (possibly symbolic) type."""

    def add_constant(self, name: str, array: Annotated[NDArray, dict(order='C', device='cpu', writable=False)], weight: bool = False) -> int:
        """
        A constant copied from a CPU array (numpy, or anything exporting DLPack); weight=True marks a named, refittable model weight.
        """

    def add_constant_from_ptr(self, name: str, dtype: DType, shape: Sequence[int], data_ptr: int, nbytes: int, weight: bool = False) -> int:
        """
        A constant copied from host memory at data_ptr (e.g. a CPU torch tensor's data_ptr()).
        """

    def add_node(self, op: str, inputs: Sequence[int | None], attrs: Mapping[str, bool | int | float | str | DType | Sequence[int] | Sequence[float]] | None = None, name: str = '') -> list[int]:
        """
        Appends a node running the op's shape rule; returns its output value ids.
        """

    def mark_output(self, value: int, name: str) -> None: ...

    def type(self, value: int) -> TensorType: ...

    def value(self, value: int) -> Value: ...

    @property
    def inputs(self) -> list[int]: ...

    @property
    def outputs(self) -> list[int]: ...

    def constants(self) -> list[int]: ...

    @property
    def num_nodes(self) -> int: ...

    @property
    def num_values(self) -> int: ...

    @property
    def nodes(self) -> list[Node]:
        """Views of the nodes, in topological order."""

    def verify(self) -> None: ...

    def to_string(self) -> str: ...

    def __str__(self) -> str: ...

class BuildPolicy:
    """
    What a build may do to an engine's numbers (TF32, GELU's form) and which attention tactic it takes; saved with the engine.
    """

    def __init__(self, *, allow_tf32: bool = True, exact_gelu: bool = False, attention_tactic: str = 'auto') -> None: ...

    @property
    def allow_tf32(self) -> bool:
        """
        f32 GEMMs and convolutions on CUDA may use TF32 tensor cores (False: strict f32).
        """

    @allow_tf32.setter
    def allow_tf32(self, arg: bool, /) -> None: ...

    @property
    def exact_gelu(self) -> bool:
        """
        Keep exact GELU exact (False: an f16/bf16 linear's GELU may run as cuBLASLt's tanh form).
        """

    @exact_gelu.setter
    def exact_gelu(self, arg: bool, /) -> None: ...

    @property
    def attention_tactic(self) -> str:
        """
        'auto' (timed), 'generated' or 'cudnn': the fused attention kernel of a CUDA sdpa.
        """

    @attention_tactic.setter
    def attention_tactic(self, arg: str, /) -> None: ...

    def __eq__(self, arg: BuildPolicy, /) -> bool: ...

    def __repr__(self) -> str: ...

class BuilderConfig:
    """How the builder turns a network into an engine."""

    def __init__(self, *, enabled_precisions: Sequence[DType] = [DType.f32], workspace_limit: int = 1073741824, optimization_level: int = 3, device: str = 'cpu', fuse_pointwise: bool = True, refittable: bool = True, policy: BuildPolicy = ...) -> None: ...

    @property
    def enabled_precisions(self) -> list[DType]:
        """Compute types the builder may use (f32, f16, bf16)."""

    @enabled_precisions.setter
    def enabled_precisions(self, arg: Sequence[DType], /) -> None: ...

    @property
    def workspace_limit(self) -> int:
        """Bytes of scratch per execution context."""

    @workspace_limit.setter
    def workspace_limit(self, arg: int, /) -> None: ...

    @property
    def optimization_level(self) -> int:
        """0..5: how hard to search tactics."""

    @optimization_level.setter
    def optimization_level(self, arg: int, /) -> None: ...

    @property
    def device(self) -> str:
        """'cpu' or 'cuda:N'."""

    @device.setter
    def device(self, arg: str, /) -> None: ...

    @property
    def fuse_pointwise(self) -> bool: ...

    @fuse_pointwise.setter
    def fuse_pointwise(self, arg: bool, /) -> None: ...

    @property
    def refittable(self) -> bool:
        """
        Keep a refit program so a Refitter can change the weights (False: immutable weights).
        """

    @refittable.setter
    def refittable(self, arg: bool, /) -> None: ...

    @property
    def policy(self) -> BuildPolicy:
        """Numerics and tactic choices (BuildPolicy)."""

    @policy.setter
    def policy(self, arg: BuildPolicy, /) -> None: ...

    def validate(self) -> None:
        """Raises InvalidArgumentError naming the bad field."""

    def __repr__(self) -> str: ...

class Builder:
    """Turns a verified Graph into an Engine."""

    def __init__(self, config: BuilderConfig = ...) -> None: ...

    @property
    def config(self) -> BuilderConfig:
        """A copy of the configuration."""

    def build(self, network: Graph, borrowed: dict[str, tuple[int, int, object]] | None = None) -> Engine:
        """
        Copies the network, runs the passes, picks kernels and returns an Engine. ``borrowed``:
        {weight name: (address, bytes, owner)} of weights, dense and in the plan weight's dtype on the
        engine's device, that the engine may read in place instead of copying (``owner`` is kept
        alive as long as the engine reads them).
        """

    def optimize(self, network: Graph) -> Graph:
        """
        The plan graph build() would give the backend: the network after this config's passes (for its device type; no device is needed), before kernels are chosen. Other Python threads run meanwhile.
        """

class SizeProgram:
    """
    A plan's sizes as multilinear functions of shape symbols, fitted from plans optimized at sample bindings (kiln/size_program.h).
    """

    @staticmethod
    def fit(samples: Sequence[tuple[Mapping[str, int], Graph]]) -> SizeProgram:
        """
        Fits from [(binding, plan)]: the first 2**n samples are a grid's corners (symbol i at its second value where bit i of the index is set), the rest check the fit. Raises UnsupportedError naming the first difference that is not a fitted integer.
        """

    def evaluate(self, base: Graph, binding: Mapping[str, int]) -> Graph:
        """
        A copy of ``base`` (a plan equal to the first sample's) with the fitted sizes at ``binding``, verified.
        """

    @property
    def symbols(self) -> list[str]: ...

    @property
    def fitted(self) -> int:
        """How many integers of the plan depend on the symbols."""

    def __str__(self) -> str: ...

class IOTensor:
    """An engine input or output: name and type."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> TensorType: ...

    @property
    def dtype(self) -> DType: ...

    @property
    def shape(self) -> list[int]: ...

    def __repr__(self) -> str: ...

class SharedArena:
    """Activation memory that contexts of several engines share (one call at a time)."""

    @property
    def bytes(self) -> int: ...

class Engine:
    """
    A built engine: the plan, its kernels and its constants (weights change only by a Refitter).
    """

    @property
    def inputs(self) -> list[IOTensor]: ...

    @property
    def outputs(self) -> list[IOTensor]: ...

    @property
    def weight_names(self) -> list[str]: ...

    @property
    def build_log(self) -> str: ...

    @property
    def policy(self) -> BuildPolicy:
        """
        The BuildPolicy the engine was built with (saved in its file; older files: the default).
        """

    @property
    def optimization_level(self) -> int:
        """The optimization level the engine was built at."""

    @property
    def device(self) -> str: ...

    @property
    def arena_bytes(self) -> int:
        """Bytes of activation memory each context allocates."""

    @property
    def naive_bytes(self) -> int:
        """Bytes the intermediates would need without reuse."""

    @property
    def workspace_size(self) -> int: ...

    @property
    def borrowed_bytes(self) -> int:
        """
        Bytes of weights the engine reads in place from the memory they were borrowed from.
        """

    @property
    def refittable(self) -> bool:
        """Whether a Refitter can change the weights (built with refittable=True)."""

    @property
    def weights_version(self) -> int:
        """How many refits the engine has had."""

    @property
    def source_weights_id(self) -> str:
        """
        An opaque label of the weights the constants came from (saved; a refit clears it).
        """

    @source_weights_id.setter
    def source_weights_id(self, arg: str, /) -> None: ...

    @property
    def num_nodes(self) -> int: ...

    @property
    def graph_text(self) -> str:
        """The plan as text."""

    def graph(self) -> Graph:
        """A copy of the optimized plan."""

    def instance(self, plan: Graph, optimization_level: int = 0, precompiled_only: bool = False, background: bool = False) -> Engine:
        """
        An engine running ``plan`` (SizeProgram.evaluate of graph(): other sizes) on this engine's constants, its kernels made at ``optimization_level`` (0: untimed); ``precompiled_only``: no kernel that compiles library code when made (cuDNN's runtime-compiled engines passed over where another serves); ``background``: made while calls run, its device work after theirs (the build turn's background priority).
        """

    @property
    def is_instance(self) -> bool:
        """Whether the engine is an instance of another (runs on its constants)."""

    def allocate_arena(self, bytes: int) -> SharedArena:
        """``bytes`` of activation memory on the engine's device, for contexts to share."""

    def arena_bound(self, plan: Graph) -> int:
        """
        The activation bytes an engine for ``plan`` on this engine's device needs at most.
        """

    def create_execution_context(self, use_graphs: bool = True, arena: SharedArena | None = None) -> ExecutionContext:
        """
        A context with its own activation memory (or ``arena``'s, a SharedArena large enough); use_graphs replays one captured CUDA graph per call.
        """

    def serialize(self, kernels_of: Engine | None = None) -> bytes:
        """
        The engine file's bytes; ``kernels_of``: an instance of this engine at its own sizes whose kernels (their choices and optimization level) the file holds in place of the engine's own.
        """

    @staticmethod
    def deserialize(data: bytes | bytearray | memoryview, device: str = 'cpu') -> Engine:
        """
        Rebuilds an engine from serialize()'s bytes; raises an EngineFileError subclass naming the problem.
        """

    def save(self, path: str | os.PathLike) -> None: ...

    @staticmethod
    def load(path: str | os.PathLike, device: str = 'cpu') -> Engine: ...

    @staticmethod
    def load_mapped(path: str | os.PathLike, device: str = 'cpu') -> Engine:
        """
        As load, but the engine's weights are views of the file mapped copy-on-write (no copy; a refit's writes stay private). The file must not be rewritten in place while the engine lives: replace it by rename.
        """

class Refitter:
    """
    Replaces a refittable engine's weights by name without rebuilding it; contexts already created see the new weights.
    """

    def __init__(self, engine: Engine) -> None:
        """Raises UnsupportedError for an engine built with immutable weights."""

    @property
    def engine(self) -> Engine: ...

    @property
    def weight_names(self) -> list[str]:
        """Every weight the engine takes: plan weights and the inputs of its refit program."""

    def weight_type(self, name: str) -> TensorType:
        """The type a weight must have; InvalidArgumentError for a name the engine lacks."""

    def set_weight(self, name: str, array: Annotated[NDArray, dict(writable=False, order='C', device='cpu')]) -> None:
        """
        A new value (a CPU array: numpy or DLPack); InvalidArgumentError naming the weight when its name, shape or dtype is wrong.
        """

    def set_weight_view(self, name: str, dtype: DType, shape: Sequence[int], address: int) -> None:
        """Like set_weight_ptr without the copy: the buffer must stay alive and unchanged until refit()."""

    def set_weight_ptr(self, name: str, dtype: DType, shape: Sequence[int], address: int) -> None:
        """A new value from a dense host buffer at `address`, copied before returning."""

    def missing_weights(self) -> list[str]:
        """
        Weights that must still be given before refit(): derived constants need all of their sources.
        """

    def refit(self) -> None:
        """
        Applies the weights given since the last refit (InvalidArgumentError naming missing ones).
        """

    @property
    def report(self) -> str:
        """What the last refit() did and the milliseconds of each part; empty before the first."""

class ExecutionContext:
    """Runs an engine; one call at a time per context."""

    @property
    def engine(self) -> Engine: ...

    @property
    def uses_graphs(self) -> bool:
        """
        Whether calls replay a captured graph (false on the CPU, when turned off, or after a failed capture).
        """

    @property
    def shares_arena(self) -> bool:
        """Whether the activations live in the SharedArena given at creation."""

    @property
    def graph_refusal(self) -> str:
        """Why graph replay was given up for direct launches ('' when it was not)."""

    @property
    def graph_captures(self) -> int:
        """
        Graphs captured so far: the staging graph (again after a refit) and those on the caller's own buffers (buffers that come again within a few calls).
        """

    def execute(self, inputs: Sequence[Annotated[NDArray, dict(order='C', device='cpu', writable=False)]]) -> list[Annotated[NDArray, dict(order='C', device='cpu')]]:
        """
        Runs on CPU arrays (numpy or DLPack) in the engine's input order; returns new numpy arrays.
        """

    def execute_ptrs(self, input_ptrs: Sequence[int], output_ptrs: Sequence[int], stream: int = 0) -> None:
        """
        Runs on raw device addresses in the engine's input/output order. Only the counts are checked.
        """

class ImportArgKind(enum.Enum):
    none = 0

    bool = 1

    int = 2

    float = 3

    string = 4

    dtype = 5

    tensor = 6

    list = 7

class ImportArg:
    """One argument of an ATen node."""

    def __init__(self) -> None: ...

    @staticmethod
    def none() -> ImportArg: ...

    @staticmethod
    def of_bool(value: bool) -> ImportArg: ...

    @staticmethod
    def of_int(value: int) -> ImportArg: ...

    @staticmethod
    def of_float(value: float) -> ImportArg: ...

    @staticmethod
    def of_string(value: str) -> ImportArg: ...

    @staticmethod
    def of_dtype(value: DType) -> ImportArg: ...

    @staticmethod
    def of_tensor(tensor_id: int) -> ImportArg: ...

    @staticmethod
    def of_list(items: Sequence[object]) -> ImportArg: ...

    @staticmethod
    def from_value(value: object) -> ImportArg:
        """
        None, bool, int, float, str, DType, ImportArg or (nested) lists of them -> ImportArg.
        """

    @property
    def kind(self) -> ImportArgKind: ...

    @kind.setter
    def kind(self, arg: ImportArgKind, /) -> None: ...

    @property
    def b(self) -> bool: ...

    @b.setter
    def b(self, arg: bool, /) -> None: ...

    @property
    def i(self) -> int: ...

    @i.setter
    def i(self, arg: int, /) -> None: ...

    @property
    def f(self) -> float: ...

    @f.setter
    def f(self, arg: float, /) -> None: ...

    @property
    def s(self) -> str: ...

    @s.setter
    def s(self, arg: str, /) -> None: ...

    @property
    def dtype(self) -> DType: ...

    @dtype.setter
    def dtype(self, arg: DType, /) -> None: ...

    @property
    def tensor(self) -> int: ...

    @tensor.setter
    def tensor(self, arg: int, /) -> None: ...

    @property
    def list(self) -> list[ImportArg]: ...

    @list.setter
    def list(self, arg: Sequence[ImportArg], /) -> None: ...

    def to_value(self) -> object:
        """The Python value (tensor references stay ImportArg)."""

    def __repr__(self) -> str: ...

class ImportTensor:
    """Metadata of one tensor of an ATen graph."""

    def __init__(self, dtype: DType, shape: Sequence[int], strides: Sequence[int] | None = None, symbols: Sequence[str] = [], sym_min: Sequence[int] = [], sym_max: Sequence[int] = []) -> None: ...

    @property
    def dtype(self) -> DType: ...

    @dtype.setter
    def dtype(self, arg: DType, /) -> None: ...

    @property
    def shape(self) -> list[int]: ...

    @shape.setter
    def shape(self, arg: Sequence[int], /) -> None: ...

    @property
    def strides(self) -> list[int]: ...

    @strides.setter
    def strides(self, arg: Sequence[int], /) -> None: ...

    @property
    def symbols(self) -> list[str]: ...

    @symbols.setter
    def symbols(self, arg: Sequence[str], /) -> None: ...

    @property
    def sym_min(self) -> list[int]: ...

    @sym_min.setter
    def sym_min(self, arg: Sequence[int], /) -> None: ...

    @property
    def sym_max(self) -> list[int]: ...

    @sym_max.setter
    def sym_max(self, arg: Sequence[int], /) -> None: ...

    @property
    def sized(self) -> bool:
        """Its size depends on shape symbols: its node is not folded into a constant."""

    @sized.setter
    def sized(self, arg: bool, /) -> None: ...

class ImportNode:
    """One ATen node: overload name, arguments and output tensor ids."""

    def __init__(self, target: str, args: Sequence[object] = [], kwargs: Mapping[str, object] | None = None, outputs: Sequence[int] = [], name: str = '') -> None: ...

    @property
    def target(self) -> str: ...

    @target.setter
    def target(self, arg: str, /) -> None: ...

    @property
    def name(self) -> str: ...

    @name.setter
    def name(self, arg: str, /) -> None: ...

    @property
    def args(self) -> list[ImportArg]: ...

    @args.setter
    def args(self, arg: Sequence[ImportArg], /) -> None: ...

    @property
    def kwargs(self) -> dict[str, object]: ...

    @kwargs.setter
    def kwargs(self, arg: dict, /) -> None: ...

    @property
    def outputs(self) -> list[int]: ...

    @outputs.setter
    def outputs(self, arg: Sequence[int], /) -> None: ...

    def __repr__(self) -> str: ...

class ImportConstant:
    """A weight or buffer of an ATen graph (bytes held by Kiln)."""

    @property
    def tensor(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> bool: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def data(self) -> bytes:
        """A copy of the bytes."""

class ImportSupport:
    """can_import's answer; truthy when supported."""

    @property
    def supported(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    def __bool__(self) -> bool: ...

    def __repr__(self) -> str: ...

class ConstantBytes:
    """The host bytes of one described constant, shared by descriptions."""

    @property
    def nbytes(self) -> int:
        """Its size in bytes."""

class ImportGraph:
    """A whole ATen graph: tensors, inputs, constants, nodes, outputs."""

    def __init__(self) -> None: ...

    @overload
    def add_tensor(self, dtype: DType, shape: Sequence[int], strides: Sequence[int] | None = None, symbols: Sequence[str] = [], sym_min: Sequence[int] = [], sym_max: Sequence[int] = [], sized: bool = False) -> int:
        """
        Returns the new tensor's id. ``sized``: its size depends on shape symbols (not folded into a constant).
        """

    @overload
    def add_tensor(self, tensor: ImportTensor) -> int: ...

    def add_input(self, tensor: int, name: str) -> None: ...

    def add_output(self, tensor: int, name: str) -> None: ...

    def add_constant(self, tensor: int, name: str, data: bytes | bytearray | memoryview | numpy.ndarray, weight: bool = True) -> None:
        """
        A constant copied from a C-contiguous buffer (bytes, numpy array, ...).
        """

    def add_constant_from_ptr(self, tensor: int, name: str, data_ptr: int, nbytes: int, weight: bool = True) -> ConstantBytes:
        """
        A constant copied from host memory (e.g. a CPU torch tensor's data_ptr()); returns the copy, which add_shared_constant gives other descriptions of the same tensor.
        """

    def add_shared_constant(self, tensor: int, name: str, data: ConstantBytes, weight: bool = True) -> None:
        """
        A constant whose bytes another description copied (add_constant_from_ptr), shared, not copied.
        """

    @overload
    def add_node(self, target: str, args: Sequence[object], kwargs: Mapping[str, object] | None = None, outputs: Sequence[int] = [], name: str = '') -> None:
        """
        Appends a node; args are plain values, tensors as ImportArg.of_tensor(id).
        """

    @overload
    def add_node(self, node: ImportNode) -> None: ...

    @property
    def num_tensors(self) -> int: ...

    @property
    def num_nodes(self) -> int: ...

    def tensor(self, id: int) -> ImportTensor: ...

    @property
    def tensors(self) -> list[ImportTensor]:
        """A copy of the tensor table."""

    @property
    def inputs(self) -> list[tuple[int, str]]: ...

    @property
    def outputs(self) -> list[tuple[int, str]]: ...

    @property
    def constants(self) -> list[ImportConstant]: ...

    @property
    def nodes(self) -> list[ImportNode]: ...

def can_import(node: ImportNode, graph: ImportGraph) -> ImportSupport:
    """
    Whether Kiln has an importer for node.target that accepts these arguments and metadata.
    """

class BuildTrial:
    """
    The partitioner's question about each node of a graph, asked in FX order: the importers (each accepted node joins one trial graph), then the backend for the device about the ops it converted to. No device needs to be present.
    """

    def __init__(self, device: str) -> None: ...

    def add(self, node: ImportNode, graph: ImportGraph) -> ImportSupport:
        """
        Whether Kiln can build this node for the device, after the nodes added before it.
        """

def import_aten(graph: ImportGraph) -> Graph:
    """
    The whole description -> Graph; raises UnsupportedError naming the first node it cannot take.
    """

def supported_aten_targets() -> list[str]:
    """Every ATen overload with an importer, sorted."""

def write_bundle(engines: Sequence[bytes | bytearray | memoryview | numpy.ndarray], inputs: Sequence[tuple[str, DType, Sequence[int]]], steps: Sequence[tuple[str, int, Sequence[tuple[int, int]]]], outputs: Sequence[tuple[str, tuple[int, int], DType, Sequence[int]]], input_symbols: Sequence[tuple[int, int, str, int, int]] = [], output_symbols: Sequence[tuple[int, int, str, int, int]] = [], ranges: Sequence[tuple[int, Mapping[str, int], SizeProgram, Mapping[str, int]]] = []) -> bytes:
    """
    The bytes of a Kiln bundle: engine files, the program's inputs (name, dtype, shape), its steps (name, engine index, arguments) and outputs (name, value, dtype, shape). A value is (-1, i): program input i, or (s, k): output k of step s. A dynamic program also gives the symbolic dims of its inputs and outputs (tensor, dim, symbol, min, max; the shapes hold the compiled extents) and the ranges of its engines (engine, the binding it was built at, its SizeProgram, the symbols its plan holds). Raises InvalidArgumentError naming what does not fit the engines.
    """

class Bundle:
    """A Kiln bundle: engines and the glue that calls them (kiln/bundle.h)."""

    @staticmethod
    def load(path: str | os.PathLike, device: str | None = None) -> Bundle:
        """
        Loads a bundle file on `device` (None: the device kind its engines were built for, device 0); raises an EngineFileError subclass naming the problem.
        """

    @staticmethod
    def deserialize(data: bytes | bytearray | memoryview, device: str | None = None) -> Bundle: ...

    @property
    def inputs(self) -> list[IOTensor]: ...

    @property
    def outputs(self) -> list[IOTensor]: ...

    @property
    def engines(self) -> list[Engine]: ...

    @property
    def device(self) -> str: ...

    @property
    def kiln_version(self) -> str: ...

    @property
    def steps(self) -> list[tuple[str, int, list[tuple[int, int]]]]:
        """
        Each engine call: (name, engine index, arguments as (-1, input) or (step, output)).
        """

    def create_context(self, use_graphs: bool = True) -> BundleContext:
        """
        A context with its own buffers; use_graphs replays captured CUDA graphs per engine call. A dynamic bundle's runs at the sizes it was compiled at (at() for others).
        """

    @property
    def dynamic(self) -> bool:
        """Whether an input has a symbolic dim (see at())."""

    def bind(self, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        """The binding of the inputs' symbols that inputs of these shapes give."""

    def at(self, binding: Mapping[str, int]) -> Bundle:
        """
        This bundle at a binding of its symbols: a static bundle (instances made now).
        """

    def run(self, inputs: Sequence[numpy.ndarray]) -> list[numpy.ndarray]:
        """
        Runs on CPU arrays in the bundle's input order (a context made for the call; a dynamic bundle at the sizes of the arrays); returns numpy arrays.
        """

class BundleContext:
    """Runs a bundle; one call at a time per context."""

    def run(self, inputs: Sequence[numpy.ndarray]) -> list[numpy.ndarray]:
        """Runs on CPU arrays in the bundle's input order; returns numpy arrays."""

    def execute_ptrs(self, input_ptrs: Sequence[int], output_ptrs: Sequence[int], stream: int | None = 0) -> None:
        """
        Runs on raw addresses of dense buffers on the bundle's device, in its input/output order.
        """

def checksum64(address: int, nbytes: int) -> int:
    """
    The engine file checksum (checksum64) of `nbytes` bytes at a host address: a fast fingerprint.
    """

def word_checksum(device: str, buffers: Sequence[tuple[int, int]], stream: int | None = None) -> int:
    """
    The word checksum of (address, nbytes) buffers in `device`'s memory laid end to end, computed where they live, after the work queued on `stream` (a cudaStream_t as an int; None: the legacy default stream). Each buffer is padded with zeros to whole 8-byte words; word w at index i adds m ^ (m >> 29), m = (w ^ i * 0x5851F42D4C957F2D) * 0x2545F4914F6CDD1D, modulo 2**64.
    """

def set_timing_cache_path(path: str) -> None:
    """Where CUDA builds keep their timing cache file ($KILN_TIMING_CACHE, when set, wins)."""

def cuda_available() -> bool:
    """Whether this build has the CUDA backend and a CUDA device is present."""

def warm_up(device: str) -> str:
    """
    Sets up the libraries of `device`'s backend (CUDA: the upload lanes, the checksum, launch fence and graph fill kernels, cuBLASLt) once per process and says what it did and how long it took; '' when there was nothing to do or it was done before. Blocks.
    """
