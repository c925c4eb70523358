"""kiln._C as a Python API: exceptions, dtypes, Graph, Builder, Engine, ExecutionContext, import.

Needs numpy only (no torch): the core bindings must work without PyTorch installed.
The ops used (linear, matmul, add, relu) are checked for numerics in test_ops.py; here they only
carry data through the bindings.
"""

from __future__ import annotations

import gc
import pickle
import struct
import time
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import Builder, BuilderConfig, DType, Engine, ErrorCode, Graph


# ---- helpers ------------------------------------------------------------------------------
def linear_relu_graph(rng: np.random.Generator, k: int = 8, n: int = 5):
    """y = relu(x @ w.T + b) with w, b as named weights; returns the graph and the weights."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    g = Graph()
    x = g.add_input("x", DType.f32, [3, k])
    wi = g.add_constant("fc.weight", w, weight=True)
    bi = g.add_constant("fc.bias", b, weight=True)
    (h,) = g.add_node("linear", [x, wi, bi], name="fc")
    g.mark_output(h, "y")
    return g, w, b


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.T.astype(np.float64) + b


def _block_sum(data: bytes) -> int:
    mask, m = (1 << 64) - 1, 0x9E3779B97F4A7C15
    lanes = [0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89]
    for word in range((len(data) + 7) // 8):
        w = int.from_bytes(data[8 * word: 8 * word + 8], "little")
        x = ((lanes[word % 4] ^ w) * m) & mask
        lanes[word % 4] = ((x << 31) | (x >> 33)) & mask
    h = (len(data) * m) & mask
    for lane in lanes:
        h = ((h ^ lane) * m) & mask
        h ^= h >> 32
    return h


def checksum64(data: bytes) -> int:
    """The engine file checksum as src/serialize/byte_io.h describes it."""
    chunk = 1 << 20
    if len(data) <= chunk:
        return _block_sum(data)
    sums = b"".join(_block_sum(data[at:at + chunk]).to_bytes(8, "little") for at in range(0, len(data), chunk))
    return _block_sum(sums)


@pytest.fixture
def engine(rng: np.random.Generator):
    g, w, b = linear_relu_graph(rng)
    return Builder(BuilderConfig(fuse_pointwise=False)).build(g), w, b


# ---- exceptions ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls, bases", [
    (kiln.InvalidArgumentError, (kiln.KilnError, ValueError)),
    (kiln.UnsupportedError, (kiln.KilnError, NotImplementedError)),
    (kiln.ShapeMismatchError, (kiln.KilnError, ValueError)),
    (kiln.EngineFileError, (kiln.KilnError,)),
    (kiln.TruncatedError, (kiln.EngineFileError,)),
    (kiln.CorruptedError, (kiln.EngineFileError,)),
    (kiln.VersionMismatchError, (kiln.EngineFileError,)),
    (kiln.DeviceMismatchError, (kiln.EngineFileError,)),
    (kiln.IoError, (kiln.KilnError, OSError)),
    (kiln.InternalError, (kiln.KilnError,)),
    (kiln.KilnError, (RuntimeError,)),
])
def test_exception_hierarchy(cls: type, bases: tuple) -> None:
    for base in bases:
        assert issubclass(cls, base)
    assert cls.__module__ == "kiln" and getattr(kiln, cls.__name__) is cls


def test_unknown_op_is_invalid_argument() -> None:
    g = Graph()
    x = g.add_input("x", DType.f32, [2])
    with pytest.raises(kiln.InvalidArgumentError, match="unknown op 'frobnicate'") as e:
        g.add_node("frobnicate", [x])
    assert e.value.code == ErrorCode.invalid_argument
    assert isinstance(e.value, ValueError)


def test_shape_rule_errors_name_op_and_shapes() -> None:
    g = Graph()
    a = g.add_input("a", DType.f32, [2, 3])
    b = g.add_input("b", DType.f32, [4, 5])
    with pytest.raises(kiln.ShapeMismatchError, match="matmul") as e:
        g.add_node("matmul", [a, b])
    assert e.value.code == ErrorCode.shape_mismatch
    assert g.num_nodes == 0  # nothing was appended


def test_graph_argument_errors() -> None:
    g = Graph()
    x = g.add_input("x", DType.f32, [2, 2])
    with pytest.raises(kiln.InvalidArgumentError, match="duplicate graph input name 'x'"):
        g.add_input("x", DType.f32, [2])
    with pytest.raises(kiln.InvalidArgumentError, match="attribute 'axis'"):
        g.add_node("softmax", [x], {"axis": {"nested": 1}})
    with pytest.raises(kiln.InvalidArgumentError, match=r"shape\[1\] must be an int"):
        g.add_input("y", DType.f32, [2, "3"])
    with pytest.raises(kiln.InvalidArgumentError, match="input 1 must be a value id"):
        g.add_node("add", [x, "x"])
    with pytest.raises(kiln.InvalidArgumentError, match="value id 99 out of range"):
        g.type(99)
    with pytest.raises(kiln.InvalidArgumentError, match="needs 16 bytes, got nbytes=8"):
        g.add_constant_from_ptr("c", DType.f32, [2, 2], 1234, 8)
    with pytest.raises(TypeError):
        g.add_input("z", "f32", [1])  # a DType, not a string


def test_builder_config_validates_on_construction() -> None:
    with pytest.raises(kiln.InvalidArgumentError, match="optimization_level"):
        BuilderConfig(optimization_level=9)
    with pytest.raises(kiln.InvalidArgumentError, match="enabled_precisions"):
        BuilderConfig(enabled_precisions=[DType.i32])
    with pytest.raises(kiln.InvalidArgumentError):
        BuilderConfig(device="tpu:0")
    c = BuilderConfig(enabled_precisions=[DType.f32, DType.f16], optimization_level=1, fuse_pointwise=False)
    assert c.enabled_precisions == [DType.f32, DType.f16]
    assert c.optimization_level == 1 and not c.fuse_pointwise and c.device == "cpu"
    assert "optimization_level=1" in repr(c)
    assert Builder(c).config.optimization_level == 1


def test_error_pickles_and_keeps_message() -> None:
    with pytest.raises(kiln.KilnError) as e:
        kiln.dtype_from_name("f33")
    assert "unknown dtype 'f33'" in str(e.value) and "bf16" in str(e.value)
    again = pickle.loads(pickle.dumps(e.value))
    assert type(again) is kiln.InvalidArgumentError and str(again) == str(e.value)


# ---- dtypes -------------------------------------------------------------------------------
def test_dtype_names_and_numpy_round_trip() -> None:
    names = [d.name for d in DType]
    assert names == ["f32", "f16", "bf16", "f64", "i64", "i32", "i8", "u8", "bool"]
    for d in DType:
        assert kiln.dtype_from_name(d.name) is d
        if d is DType.bf16:
            with pytest.raises(kiln.UnsupportedError, match="bf16"):
                kiln.dtype_to_numpy(d)
            continue
        npd = kiln.dtype_to_numpy(d)
        assert kiln.dtype_from_numpy(npd) is d
        assert npd.itemsize == kiln.dtype_size(d)
    assert kiln.dtype_from_numpy(np.float32) is DType.f32
    assert kiln.dtype_from_numpy("bool") is DType.bool
    with pytest.raises(kiln.UnsupportedError, match="complex64"):
        kiln.dtype_from_numpy(np.complex64)
    assert kiln.is_floating(DType.bf16) and not kiln.is_floating(DType.i8)
    assert kiln.is_integral(DType.u8) and not kiln.is_integral(DType.bool)


# ---- Graph --------------------------------------------------------------------------------
def test_graph_building_and_inspection(rng: np.random.Generator) -> None:
    g, w, _ = linear_relu_graph(rng)
    assert g.inputs == [0] and g.num_nodes == 1
    assert g.type(g.outputs[0]).shape == [3, 5]
    assert str(g.type(g.outputs[0])) == "f32[3,5]"
    v = g.value(1)
    assert v.name == "fc.weight" and v.is_weight and v.is_constant and not v.is_input
    node = g.nodes[0]
    assert node.op == "linear" and node.name == "fc" and node.inputs == [0, 1, 2] and node.body is None
    assert "linear" in str(g) and "fc.weight" in g.to_string()
    g.verify()
    copy = g.copy()
    copy.add_input("extra", DType.f32, [1])
    assert len(copy.inputs) == 2 and len(g.inputs) == 1


def test_attrs_keep_their_python_types() -> None:
    g = Graph()
    x = g.add_input("x", DType.f32, [2, 3])
    attrs = {"axes": [1], "keepdim": True}
    (y,) = g.add_node("reduce_max", [x], attrs)
    assert g.nodes[0].attrs == attrs
    assert g.type(y).shape == [2, 1]
    (c,) = g.add_node("cast", [x], {"dtype": DType.f16})
    assert g.nodes[1].attrs == {"dtype": DType.f16} and g.type(c).dtype == DType.f16
    (p,) = g.add_node("pad", [x], {"pads": (np.int64(0), 0, 1, 1), "mode": "constant", "value": np.float32(2)})
    a = g.nodes[2].attrs
    assert a["pads"] == [0, 0, 1, 1] and type(a["value"]) is float and a["mode"] == "constant"
    assert g.type(p).shape == [2, 5]


def test_optional_inputs_are_none() -> None:
    g = Graph()
    x = g.add_input("x", DType.f32, [2, 4])
    (y,) = g.add_node("layer_norm", [x, None, None], {"normalized_rank": 1, "eps": 1e-5})
    assert g.nodes[0].inputs == [x, None, None]


def test_constants_are_copied(rng: np.random.Generator) -> None:
    w = rng.standard_normal((4, 4)).astype(np.float32)
    keep = w.copy()
    g = Graph()
    x = g.add_input("x", DType.f32, [2, 4])
    wi = g.add_constant("w", w, weight=True)
    wp = g.add_constant_from_ptr("w2", DType.f32, [4, 4], w.ctypes.data, w.nbytes)
    (a,) = g.add_node("matmul", [x, wi])
    (b,) = g.add_node("matmul", [x, wp])
    g.mark_output(a, "a")
    g.mark_output(b, "b")
    w[:] = 0  # the graph holds its own bytes
    xs = rng.standard_normal((2, 4)).astype(np.float32)
    ra, rb = Builder().build(g).create_execution_context().execute([xs])
    np.testing.assert_allclose(ra, xs @ keep, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rb, xs @ keep, rtol=1e-5, atol=1e-6)


def test_symbolic_input_type() -> None:
    t = kiln.TensorType.from_dims(DType.f32, [kiln.Dim(4, "N", 1, 16), kiln.Dim(3)])
    assert str(t) == "f32[N=4:1..16,3]" and t.shape == [4, 3] and t.numel == 12 and t.nbytes == 48
    g = Graph()
    x = g.add_input("x", t)
    assert g.type(x) == t and not g.type(x).dims[0].is_static


def test_op_names_and_families() -> None:
    names = kiln.op_names()
    assert len(names) == len(set(names)) and "fused_pointwise" in names and names[0] == "relu"
    assert kiln.op_family("conv_transpose") == "conv" and kiln.op_family("where") == "where"
    with pytest.raises(kiln.InvalidArgumentError, match="unknown op"):
        kiln.op_family("nope")


# ---- Engine and ExecutionContext -----------------------------------------------------------
def test_engine_properties(engine) -> None:
    e, _, _ = engine
    assert [(t.name, t.dtype, t.shape) for t in e.inputs] == [("x", DType.f32, [3, 8])]
    assert [(t.name, t.dtype, t.shape) for t in e.outputs] == [("y", DType.f32, [3, 5])]
    assert sorted(e.weight_names) == ["fc.bias", "fc.weight"]
    assert e.device == "cpu" and "linear" in e.graph_text and "pass" in e.build_log
    assert e.naive_bytes >= e.arena_bytes >= 0 and e.num_nodes >= 1
    assert e.graph().num_nodes == e.num_nodes


def test_execute_numpy_and_ptrs(engine, rng: np.random.Generator) -> None:
    e, w, b = engine
    ctx = e.create_execution_context()
    x = rng.standard_normal((3, 8)).astype(np.float32)
    (y,) = ctx.execute([x])
    assert y.dtype == np.float32 and y.shape == (3, 5)
    np.testing.assert_allclose(y, reference(x, w, b), rtol=1e-5, atol=1e-5)
    out = np.full((3, 5), np.nan, np.float32)
    ctx.execute_ptrs([x.ctypes.data], [out.ctypes.data])
    np.testing.assert_array_equal(out, y)
    # a strided view is made contiguous on the way in
    wide = rng.standard_normal((3, 16)).astype(np.float32)
    (y2,) = ctx.execute([wide[:, ::2]])
    np.testing.assert_allclose(y2, reference(wide[:, ::2], w, b), rtol=1e-5, atol=1e-5)


def test_execute_checks(engine) -> None:
    e, _, _ = engine
    ctx = e.create_execution_context()
    with pytest.raises(kiln.ShapeMismatchError, match="input 'x' has shape f32\\[3,7\\]"):
        ctx.execute([np.ones((3, 7), np.float32)])
    with pytest.raises(kiln.InvalidArgumentError, match="input 'x' must be f32, got f64"):
        ctx.execute([np.ones((3, 8), np.float64)])
    with pytest.raises(kiln.InvalidArgumentError, match="takes 1 inputs, got 2"):
        ctx.execute([np.ones((3, 8), np.float32)] * 2)
    with pytest.raises(kiln.InvalidArgumentError, match="got 0 output buffers"):
        ctx.execute_ptrs([np.ones((3, 8), np.float32).ctypes.data], [])
    with pytest.raises(kiln.InvalidArgumentError, match=r"input_ptrs\[0\] must be an int address"):
        ctx.execute_ptrs(["x"], [0])
    # the context is still usable after failed checks
    (y,) = ctx.execute([np.ones((3, 8), np.float32)])
    assert np.isfinite(y).all()


def test_context_keeps_engine_alive(rng: np.random.Generator) -> None:
    g, w, b = linear_relu_graph(rng)
    e = Builder().build(g)
    ctx = e.create_execution_context()
    del e, g
    gc.collect()
    x = rng.standard_normal((3, 8)).astype(np.float32)
    (y,) = ctx.execute([x])
    np.testing.assert_allclose(y, reference(x, w, b), rtol=1e-5, atol=1e-5)
    assert ctx.engine.outputs[0].name == "y"


def test_bool_and_integer_outputs_come_back_as_numpy() -> None:
    g = Graph()
    a = g.add_input("a", DType.i64, [4])
    b = g.add_input("b", DType.i64, [4])
    (s,) = g.add_node("add", [a, b])
    (lt,) = g.add_node("lt", [a, b])
    g.mark_output(s, "s")
    g.mark_output(lt, "lt")
    ctx = Builder(BuilderConfig(fuse_pointwise=False)).build(g).create_execution_context()
    x, y = np.array([1, -2, 3, 4]), np.array([5, 6, -7, 4])
    s_out, lt_out = ctx.execute([x, y])
    assert s_out.dtype == np.int64 and lt_out.dtype == np.bool_
    np.testing.assert_array_equal(s_out, x + y)
    np.testing.assert_array_equal(lt_out, x < y)


# ---- serialization ------------------------------------------------------------------------
def test_serialize_round_trip(engine, rng: np.random.Generator, tmp_path: Path) -> None:
    e, w, b = engine
    data = e.serialize()
    assert isinstance(data, bytes) and data[:8] == b"KILNENG\0"
    x = rng.standard_normal((3, 8)).astype(np.float32)
    (want,) = e.create_execution_context().execute([x])
    for loaded in (Engine.deserialize(data), Engine.deserialize(bytearray(data), device="cpu")):
        assert [(t.name, t.shape) for t in loaded.inputs] == [("x", [3, 8])]
        assert sorted(loaded.weight_names) == ["fc.bias", "fc.weight"]
        assert loaded.graph_text == e.graph_text
        assert "loaded from an engine file" in loaded.build_log
        (got,) = loaded.create_execution_context().execute([x])
        np.testing.assert_array_equal(got, want)
    e.save(tmp_path / "a.kiln")
    e.save(str(tmp_path / "b.kiln"))
    assert (tmp_path / "a.kiln").read_bytes() == data
    (got,) = Engine.load(tmp_path / "b.kiln").create_execution_context().execute([x])
    np.testing.assert_array_equal(got, want)


def test_damaged_engine_files_raise_engine_file_errors(engine, tmp_path: Path) -> None:
    e, _, _ = engine
    data = e.serialize()
    with pytest.raises(kiln.TruncatedError, match="truncated") as t:
        Engine.deserialize(data[: len(data) // 2])
    assert t.value.code == ErrorCode.truncated
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    with pytest.raises(kiln.CorruptedError, match="checksum"):
        Engine.deserialize(bytes(flipped))
    with pytest.raises(kiln.CorruptedError):
        Engine.deserialize(b"not an engine file at all, just some bytes")
    other_version = bytearray(data)
    other_version[8:12] = struct.pack("<I", 999)
    with pytest.raises(kiln.VersionMismatchError, match="999"):
        Engine.deserialize(bytes(other_version))
    # another backend name, with a valid checksum: only the device check can refuse it
    body = data[:-8]
    at = body.index(b"\x03\x00\x00\x00cpu", 20)
    foreign = body[:at] + b"\x03\x00\x00\x00xpu" + body[at + 7:]
    foreign += struct.pack("<Q", checksum64(foreign))
    with pytest.raises(kiln.DeviceMismatchError, match="xpu"):
        Engine.deserialize(foreign)
    with pytest.raises(kiln.EngineFileError):
        Engine.deserialize(b"")
    with pytest.raises(kiln.IoError, match="does-not-exist") as io:
        Engine.load(tmp_path / "does-not-exist.kiln")
    assert isinstance(io.value, OSError)
    with pytest.raises(kiln.InvalidArgumentError, match="buffer"):
        Engine.deserialize(12345)


# ---- import structures --------------------------------------------------------------------
def test_import_arg_conversions() -> None:
    A, K = kiln.ImportArg, kiln.ImportArgKind
    assert A.none().kind == K.none
    assert A.of_int(3).i == 3 and A.of_float(0.5).f == 0.5 and A.of_bool(True).b
    assert A.of_string("tanh").s == "tanh" and A.of_dtype(DType.f16).dtype == DType.f16
    t = A.of_tensor(7)
    assert t.kind == K.tensor and t.tensor == 7 and repr(t) == "ImportArg(%7)"
    v = A.from_value([1, 2.5, None, True, "x", DType.i8, (t, [3])])
    assert v.kind == K.list
    assert [a.kind for a in v.list] == [K.int, K.float, K.none, K.bool, K.string, K.dtype, K.list]
    assert v.to_value()[:6] == [1, 2.5, None, True, "x", DType.i8]
    assert A.from_value(np.int64(4)).kind == K.int
    with pytest.raises(kiln.InvalidArgumentError, match="dict"):
        A.from_value({"a": 1})


def test_import_graph_description() -> None:
    ig = kiln.ImportGraph()
    x = ig.add_tensor(DType.f32, [2, 3])
    w = ig.add_tensor(DType.f32, [3], strides=[1])
    y = ig.add_tensor(DType.f32, [2, 3])
    ig.add_input(x, "x")
    wdata = np.arange(3, dtype=np.float32)
    ig.add_constant(w, "bias", wdata)
    ig.add_constant_from_ptr(w, "bias2", wdata.ctypes.data, wdata.nbytes, weight=False)
    ig.add_node("aten.add.Tensor", [kiln.ImportArg.of_tensor(x), kiln.ImportArg.of_tensor(w)], {"alpha": 1},
                outputs=[y], name="add")
    ig.add_output(y, "y")
    assert ig.num_tensors == 3 and ig.num_nodes == 1
    assert ig.tensor(w).strides == [1] and ig.tensors[0].shape == [2, 3]
    assert ig.inputs == [(x, "x")] and ig.outputs == [(y, "y")]
    c0, c1 = ig.constants
    assert c0.name == "bias" and c0.weight and c0.data == wdata.tobytes() and not c1.weight
    node = ig.nodes[0]
    assert node.target == "aten.add.Tensor" and node.outputs == [y] and node.kwargs == {"alpha": 1}
    assert node.args[1].tensor == w
    with pytest.raises(kiln.InvalidArgumentError, match="needs 12 dense bytes, got 8"):
        ig.add_constant(w, "short", b"\0" * 8)
    with pytest.raises(kiln.InvalidArgumentError, match="tensor id 9 out of range"):
        ig.add_input(9, "nope")


def test_import_graphs_share_a_constant_copy() -> None:
    wdata = np.arange(3, dtype=np.float32)
    first, second = kiln.ImportGraph(), kiln.ImportGraph()
    copy = first.add_constant_from_ptr(first.add_tensor(DType.f32, [3]), "bias", wdata.ctypes.data, wdata.nbytes)
    wdata[:] = -1.0  # the descriptions hold the copy, not the buffer
    second.add_shared_constant(second.add_tensor(DType.f32, [3]), "bias", copy, weight=False)
    assert copy.nbytes == 12
    assert first.constants[0].data == second.constants[0].data == np.arange(3, dtype=np.float32).tobytes()
    assert first.constants[0].weight and not second.constants[0].weight
    with pytest.raises(kiln.InvalidArgumentError, match="constant 'short' .* needs 8 dense bytes, got 12"):
        second.add_shared_constant(second.add_tensor(DType.f32, [2]), "short", copy)


def test_can_import_and_targets() -> None:
    targets = kiln.supported_aten_targets()
    assert targets == sorted(targets) and all(isinstance(t, str) for t in targets)
    ig = kiln.ImportGraph()
    x = ig.add_tensor(DType.f32, [2])
    node = kiln.ImportNode("aten.no_such_op.default", [kiln.ImportArg.of_tensor(x)], outputs=[x], name="n")
    answer = kiln.can_import(node, ig)
    assert not answer and not answer.supported and "aten.no_such_op.default" in answer.reason
    assert "aten.no_such_op.default" not in targets


def test_import_aten_builds_a_runnable_graph() -> None:
    if "aten.relu.default" not in kiln.supported_aten_targets():
        pytest.skip("aten.relu.default has no importer in this build")
    ig = kiln.ImportGraph()
    x = ig.add_tensor(DType.f32, [2, 3])
    y = ig.add_tensor(DType.f32, [2, 3])
    ig.add_input(x, "x")
    ig.add_node("aten.relu.default", [kiln.ImportArg.of_tensor(x)], outputs=[y], name="relu")
    ig.add_output(y, "y")
    assert kiln.can_import(ig.nodes[0], ig)
    g = kiln.import_aten(ig)
    xs = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    (out,) = Builder().build(g).create_execution_context().execute([xs])
    np.testing.assert_array_equal(out, np.maximum(xs, 0))


def test_import_unsupported_node_raises_unsupported() -> None:
    ig = kiln.ImportGraph()
    x = ig.add_tensor(DType.f32, [2])
    y = ig.add_tensor(DType.f32, [2])
    ig.add_input(x, "x")
    ig.add_node("aten.no_such_op.default", [kiln.ImportArg.of_tensor(x)], outputs=[y], name="weird_node")
    ig.add_output(y, "y")
    with pytest.raises(kiln.UnsupportedError, match="aten.no_such_op.default"):
        kiln.import_aten(ig)


def test_describing_a_large_graph_is_fast() -> None:
    """5000 FX-like nodes (tensor refs, ints, lists, floats, kwargs) in well under a second."""
    T = kiln.ImportArg.of_tensor
    ig = kiln.ImportGraph()
    start = time.perf_counter()
    prev = ig.add_tensor(DType.f32, [8, 64, 32, 32])
    ig.add_input(prev, "x")
    for i in range(5000):
        out = ig.add_tensor(DType.f32, [8, 64, 32, 32], strides=[65536, 1024, 32, 1])
        ig.add_node("aten.convolution.default", [T(prev), T(prev), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1],
                    {"alpha": 1.0}, outputs=[out], name=f"conv_{i}")
        prev = out
    ig.add_output(prev, "y")
    elapsed = time.perf_counter() - start
    assert ig.num_nodes == 5000
    assert elapsed < 0.5, f"describing 5000 nodes took {elapsed:.3f} s"


# ---- the type stub ------------------------------------------------------------------------
def test_type_stub_lists_every_public_name() -> None:
    import ast
    import inspect

    stub = Path(kiln.__file__).with_name("_C.pyi")
    assert stub.exists() and stub.with_name("py.typed").exists()
    tree = ast.parse(stub.read_text())
    top: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            top[node.name] |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets
                               if isinstance(t, ast.Name)}
            top[node.name] |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
                               and isinstance(n.target, ast.Name)}
        elif isinstance(node, ast.FunctionDef):
            top[node.name] = set()
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top[node.target.id] = set()
    missing = []
    for name, obj in vars(kiln._C).items():
        if name.startswith("_") and name != "__version__":
            continue
        if name not in top:
            missing.append(name)
        elif inspect.isclass(obj) and not issubclass(obj, BaseException):
            members = [m for m in vars(obj) if not m.startswith("_") or m == "__bool__"]
            missing += [f"{name}.{m}" for m in members if m not in top[name]]
    assert not missing, f"python/kiln/_C.pyi lacks {missing}; regenerate it (its header says how)"


def test_warm_up_is_a_no_op_on_the_cpu_and_names_a_bad_device() -> None:
    import threading

    from kiln.runtime import warm_up
    assert kiln._C.warm_up("cpu") == ""  # the CPU backend has no library to set up
    with pytest.raises(kiln.InvalidArgumentError, match="unknown device 'tpu'"):
        kiln._C.warm_up("tpu")
    before = set(threading.enumerate())
    warm_up("cpu")
    if not kiln._C.cuda_available():
        warm_up("cuda:0")  # no CUDA backend or device: nothing to set up, no thread
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("kiln-warm-up")]
