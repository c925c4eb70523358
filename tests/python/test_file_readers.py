"""File readers from Python: Engine.load / load_mapped take only regular files (a FIFO, a device
or a directory is an IoError naming the path and what it is, without blocking or reading
without end), strings in engine files are UTF-8 or the file is a CorruptedError naming the
field, error messages always convert to str, attributes out of range are refused, and kiln-run
refuses /dev/zero. Every read runs under a time limit so that a regression fails, never hangs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import _C, Builder, BuilderConfig, DType, Engine, Graph, Refitter

LOADERS = [Engine.load, Engine.load_mapped]


def bounded(call, fifo: str | None = None, seconds: float = 20.0) -> BaseException | None:
    """Runs `call` on a daemon thread and returns what it raised; fails if it runs past
    `seconds`, first opening a writer on `fifo` so that a reader blocked there returns."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            t.join(5)
        pytest.fail(f"the read did not finish within {seconds} s")
    return outcome[0]


def expect_io_error(path: str, what: str, fifo: str | None = None) -> None:
    for load in LOADERS:
        err = bounded(lambda: load(path), fifo)
        assert isinstance(err, kiln.IoError), f"{load.__name__}({path!r}) gave {err!r}"
        assert isinstance(err, OSError)
        assert f"'{path}'" in str(err) and what in str(err), str(err)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = str(tmp_path / "0123abcd.kiln")  # named like a cache entry
    os.mkfifo(fifo)
    expect_io_error(fifo, "a FIFO", fifo)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_dev_zero_is_refused_unread() -> None:
    expect_io_error("/dev/zero", "a character device")


def test_directory_is_refused(tmp_path: Path) -> None:
    expect_io_error(str(tmp_path), "a directory")


# ---- strings ------------------------------------------------------------------------------
def network(weight_name: str) -> Engine:
    """x -> linear (weight `weight_name`) -> pad(mode="reflect")."""
    g = Graph()
    x = g.add_input("x", DType.f32, [2, 4])
    w = g.add_constant(weight_name, np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), weight=True)
    (h,) = g.add_node("linear", [x, w, None])
    (y,) = g.add_node("pad", [h], {"pads": [0, 0, 1, 1], "mode": "reflect"}, name="pad_node")
    g.mark_output(y, "y")
    return Builder(BuilderConfig(fuse_pointwise=False)).build(g)


def reseal(data: bytearray) -> bytes:
    """Recomputes the trailing checksum (src/serialize/engine_file.h) after an in-place edit."""
    body = np.frombuffer(data, dtype=np.uint8)
    data[-8:] = _C.checksum64(body.ctypes.data, len(data) - 8).to_bytes(8, "little")
    return bytes(data)


def with_byte(file: bytes, marker: bytes, offset: int, value: int) -> bytes:
    """`file` with byte `offset` of the length-prefixed string `marker` set to `value`."""
    at = file.index(len(marker).to_bytes(4, "little") + marker) + 4 + offset
    data = bytearray(file)
    data[at] = value
    return reseal(data)


@pytest.mark.parametrize("marker, field", [
    (b"weight_marker", "a value name"),
    (b"pad_node", "a node name"),
    (b"reflect", "a string attribute"),
])
def test_non_utf8_strings_are_corrupted_naming_the_field(tmp_path: Path, marker: bytes, field: str) -> None:
    file = network("weight_marker").serialize()
    assert Engine.deserialize(file).weight_names == ["weight_marker"]
    damaged = with_byte(file, marker, 2, 0xFF)
    with pytest.raises(kiln.CorruptedError, match=f"{field} at offset \\d+ is not valid UTF-8"):
        Engine.deserialize(damaged)
    path = tmp_path / "damaged.kiln"
    path.write_bytes(damaged)
    for load in LOADERS:
        with pytest.raises(kiln.CorruptedError, match="not valid UTF-8") as e:
            load(path)
        assert str(path) in str(e.value)


def test_refitter_weight_names_are_always_str() -> None:
    name = "poids_\u00e9_\u91cd\u307f_\U0001F600"
    engine = Engine.deserialize(network(name).serialize())
    assert Refitter(engine).weight_names == [name]
    assert engine.weight_names == [name]
    # A name whose bytes are not UTF-8 never reaches weight_names: the file does not load.
    damaged = with_byte(network("weight_marker").serialize(), b"weight_marker", 0, 0xC0)
    with pytest.raises(kiln.CorruptedError, match="a value name"):
        Refitter(Engine.deserialize(damaged))


def test_error_messages_with_undecodable_bytes_still_convert() -> None:
    path = os.fsdecode(b"/nonexistent-kiln-dir/\xff\xfe.kiln")
    with pytest.raises(kiln.IoError) as e:
        Engine.load(path)
    message = str(e.value)
    assert "nonexistent-kiln-dir" in message and "\ufffd" in message, message


# ---- attributes out of range ----------------------------------------------------------------
def conv_graph() -> tuple[Graph, int, int]:
    g = Graph()
    x = g.add_input("x", DType.f32, [1, 2, 8, 8])
    w = g.add_constant("w", np.ones((3, 2, 3, 3), np.float32), weight=True)
    return g, x, w


@pytest.mark.parametrize("attrs", [
    {"stride": [1, 1], "padding": [0, 0], "dilation": [2**62, 1]},
    {"stride": [1, 1], "padding": [2**62, 0], "dilation": [1, 1]},
    {"stride": [1, 1], "padding": [0, 0], "dilation": [2**63 - 1, 1]},
])
def test_conv_attributes_that_overflow_are_refused(attrs: dict) -> None:
    g, x, w = conv_graph()
    with pytest.raises(kiln.InvalidArgumentError, match="conv: .* overflows int64"):
        g.add_node("conv", [x, w], attrs)
    assert g.num_nodes == 0


def test_slice_with_a_step_past_the_axis_runs() -> None:
    g = Graph()
    x = g.add_input("x", DType.f32, [2, 6])
    (y,) = g.add_node("slice", [x], {"axis": 1, "start": 2, "end": 6, "step": 2**63 - 1})
    g.mark_output(y, "y")
    engine = Engine.deserialize(Builder().build(g).serialize())
    data = np.arange(12, dtype=np.float32).reshape(2, 6)
    (out,) = engine.create_execution_context().execute([data])
    np.testing.assert_array_equal(out, data[:, 2:3])


def test_file_with_an_overflowing_dilation_is_corrupted() -> None:
    g, x, w = conv_graph()
    (y,) = g.add_node("conv", [x, w], {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1]})
    g.mark_output(y, "y")
    file = Builder().build(g).serialize()
    key = b"dilation"
    at = file.index(len(key).to_bytes(4, "little") + key + b"\x04") + 4 + len(key) + 1 + 4
    data = bytearray(file)
    data[at:at + 8] = (2**62).to_bytes(8, "little")
    with pytest.raises(kiln.CorruptedError, match="overflows int64"):
        Engine.deserialize(reseal(data))


# ---- kiln-run -------------------------------------------------------------------------------
def kiln_run() -> str | None:
    build = os.environ.get("KILN_BUILD_DIR")
    if build and (Path(build) / "kiln-run").exists():
        return str(Path(build) / "kiln-run")
    return shutil.which("kiln-run")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_kiln_run_refuses_dev_zero() -> None:
    runner = kiln_run()
    if runner is None:
        pytest.skip("kiln-run is not built (set KILN_BUILD_DIR)")
    r = subprocess.run([runner, "/dev/zero"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "kiln-run: error:" in r.stderr and "'/dev/zero'" in r.stderr and "a character device" in r.stderr
