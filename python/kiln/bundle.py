"""Kiln bundles: a compiled program in one file that kiln-run and the C++ runtime run without Python.

    kiln.save(compiled, "model.kiln", arg_inputs=[x], output_format="kiln_bundle")
    # kiln-run model.kiln --inputs x.npy          or, in C++, kiln::Bundle::load("model.kiln")

A bundle holds the engines of a program saved by kiln.save and its glue: the program's inputs
(the tensor leaves of ``(args, kwargs)``, flattened in order), the engine calls in order with the
values each takes, and which values are the program's outputs (flattened). Nothing else runs:
a program with ops left to PyTorch cannot be bundled, and :func:`write_bundle` raises
``kiln.UnsupportedError`` naming them. A dynamic-shape program's bundle (:func:`dynamic_bundle_bytes`)
keeps its inputs' symbolic dims and, per block, the engine its instances run on with the block's
fitted sizes, so that ``kiln::Bundle::at`` and kiln-run serve any size in the ranges. The byte
layout is in src/runtime/bundle_file.h; the C++ API in include/kiln/bundle.h; docs/deploy.md says
how to build against it.
"""

from __future__ import annotations

import json
import operator
import os
import threading
from collections.abc import Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
import torch.fx as fx

from kiln import _C
from kiln._logging import get_logger
from kiln.archive import engine_blobs
from kiln.translate import EncodeError, kiln_dtype

log = get_logger("bundle")

__all__ = ["write_bundle", "bundle_bytes", "dynamic_bundle_bytes"]

_HINT = ("compile so that every op runs in an engine (require_full_compilation=True names those that cannot), "
         "or save with output_format='exported_program'")


def write_bundle(program: torch.nn.Module | torch.export.ExportedProgram, path: str | os.PathLike[str],
                 arg_inputs: Sequence[Any] | None = None,
                 kwarg_inputs: dict[str, Any] | None = None) -> torch.export.ExportedProgram:
    """Writes a Kiln bundle of ``program``: a program exported by kiln.save, or a compiled module
    (exported on ``arg_inputs`` as kiln.save does). Returns the exported program. The file is
    written next to ``path`` and renamed over it, so a reader never sees half a bundle."""
    if isinstance(program, torch.nn.Module):
        if arg_inputs is None:
            raise ValueError("kiln.bundle.write_bundle needs arg_inputs (example inputs) to export a module")
        from kiln.aot import save  # kiln.aot calls back into this module for output_format="kiln_bundle"
        return save(program, path, arg_inputs, kwarg_inputs, output_format="kiln_bundle")
    if not isinstance(program, torch.export.ExportedProgram):
        raise TypeError(f"kiln.bundle.write_bundle writes a torch.nn.Module or a torch.export.ExportedProgram, got a "
                        f"{type(program).__name__}")
    data = bundle_bytes(program)
    write_file(path, data)
    log.info("kiln bundle: %s: %d bytes", os.fspath(path), len(data))
    return program


def write_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes ``data`` next to ``path`` and renames it over it, so a reader never sees half a file."""
    target = os.fspath(path)
    tmp = f"{target}.tmp.{os.getpid()}.{threading.get_ident()}"  # as Engine::save: created with the usual mode
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _problem(text: str) -> _C.UnsupportedError:
    return _C.UnsupportedError(f"kiln.save(output_format='kiln_bundle'): {text}")


def _tensor_value(node: fx.Node, what: str) -> tuple[torch.Tensor, Any]:
    """The example value of a program input or output and its Kiln dtype (raises naming what a
    bundle cannot hold: a value that is no tensor, a dtype Kiln lacks)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise _problem(f"{what} is a {type(val).__name__}, not a tensor; a Kiln bundle's inputs and outputs are "
                       f"tensors")
    try:
        return val, kiln_dtype(val.dtype)
    except EncodeError as err:
        raise _problem(f"{what}: {err}") from None


def _tensor(node: fx.Node, what: str) -> tuple[Any, list[int]]:
    """The Kiln dtype and static shape of a program input or output."""
    val, dtype = _tensor_value(node, what)
    if not all(isinstance(d, int) for d in val.shape):
        raise _problem(f"{what} has the dynamic shape {list(val.shape)}; a Kiln bundle holds static shapes")
    return dtype, [int(d) for d in val.shape]


def bundle_bytes(ep: torch.export.ExportedProgram) -> bytes:
    """The bundle file of a program exported by kiln.save (raises ``kiln.UnsupportedError``
    naming what a bundle cannot hold: ops left to PyTorch, non-tensor inputs or outputs)."""
    sig = ep.graph_signature
    user_inputs = set(sig.user_inputs)
    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
              **getattr(sig, "inputs_to_lifted_tensor_constants", {})}
    blobs = dict(engine_blobs(ep))

    refs: dict[fx.Node, tuple[int, int]] = {}
    inputs: list[tuple[str, Any, list[int]]] = []
    steps: list[tuple[str, int, list[tuple[int, int]]]] = []
    step_of: dict[fx.Node, int] = {}
    engines: list[torch.Tensor] = []
    engine_of: dict[str, int] = {}
    devices: set[str] = set()
    in_pytorch: list[fx.Node] = []
    outputs: list[tuple[str, tuple[int, int], Any, list[int]]] = []
    unroutable = ""  # the first engine argument or output that is no program input or engine output

    for node in ep.graph.nodes:
        if node.op == "placeholder":
            if node.name not in user_inputs:
                continue  # a weight, buffer or engine blob: used only where an engine call or an op takes it
            refs[node] = (-1, len(inputs))
            inputs.append((node.name, *_tensor(node, f"input '{node.name}'")))
        elif node.op == "call_function" and node.target == torch.ops.kiln.execute_engine.default:
            fqn = lifted[node.args[1].name]
            name = fqn.removesuffix(".engine_blob")
            devices.add(json.loads(node.args[2])["device"])
            if fqn not in engine_of:
                engine_of[fqn] = len(engines)
                engines.append(blobs[node])
            args = []
            for a in node.args[0]:
                if a not in refs and not unroutable:  # a PyTorch op's output is reported with the ops
                    what = f"the weight or buffer '{lifted[a.name]}'" if a.name in lifted else f"'{a.name}'"
                    unroutable = (f"engine call '{name}' takes {what}, which is not a program input or an engine "
                                  f"output; {_HINT}")
                args.append(refs.get(a, (-1, 0)))
            step_of[node] = len(steps)
            steps.append((name, engine_of[fqn], args))
        elif node.op == "call_function" and node.target is operator.getitem and node.args[0] in step_of:
            refs[node] = (step_of[node.args[0]], int(node.args[1]))
        elif node.op == "output":
            for i, out in enumerate(pytree_leaves(node.args[0])):
                if isinstance(out, fx.Node) and out in refs:
                    outputs.append((f"result_{i}", refs[out], *_tensor(out, f"output {i}")))
                    continue
                if isinstance(out, fx.Node) and out.name in lifted:
                    what = f"the weight or buffer '{lifted[out.name]}'"
                elif isinstance(out, fx.Node):
                    what = f"'{out.name}'"
                else:
                    what = f"the constant {out!r}"
                if not (isinstance(out, fx.Node) and out.op == "call_function") and not unroutable:
                    unroutable = (f"output {i} is {what}, not a value a Kiln bundle computes: return only tensors "
                                  f"that engines compute or the program takes, or save with "
                                  f"output_format='exported_program'")
        else:
            in_pytorch.append(node)

    _refuse_pytorch_nodes(in_pytorch)
    if unroutable:
        raise _problem(unroutable)
    if not engines:
        raise _problem(f"the program has no Kiln engine; {_HINT}")
    if len(devices) > 1:
        raise _problem(f"its engines run on several devices ({', '.join(sorted(devices))}); a Kiln bundle runs on one")
    data = [blob.detach().cpu().contiguous().numpy() for blob in engines]
    try:
        return _C.write_bundle(data, inputs, steps, outputs)
    except _C.InvalidArgumentError as err:
        if any(_has_float64(json.loads(n.args[2])) for n in step_of):
            cause = str(err).split("] ", 1)[-1]
            raise _problem(f"{cause} (engines built with truncate_double=True take float32 where the program has "
                           f"float64, and a bundle converts nothing: compile the model in float32)") from None
        raise


def pytree_leaves(value: Any) -> list[Any]:
    """The output node's flattened outputs (a tuple or list, possibly nested)."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in pytree_leaves(v)]
    return [value]


def _op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__qualname__", None) or str(target)


def _has_float64(spec: dict[str, Any]) -> bool:
    return any(dt == "float64" for dt, _ in spec.get("inputs", []) + spec.get("outputs", []))


def dynamic_bundle_bytes(glue: fx.GraphModule) -> bytes:
    """The bundle file of a dynamic-shape program (the glue graph kiln.compile made, kiln/dynamic.py):
    its inputs with their symbolic dims and ranges, per block the engine its instances run on with
    the block's SizeProgram (kiln/instances.py), so that Bundle::at and kiln-run serve any size in
    the ranges without Python. Raises ``kiln.UnsupportedError`` naming what a bundle cannot hold:
    ops left to PyTorch, a block whose plans do not fit one engine over the range, an input dim
    that is an expression of a symbol."""
    from kiln.dynamic import DynamicBlock, Specializations  # kiln.dynamic imports kiln.aot, which imports this
    from kiln.runtime import KilnEngineModule

    table = next((m for m in glue.modules() if isinstance(m, Specializations)), None)
    if table is None:
        raise _problem("the module holds no dynamic-shape program")
    shapes = table.shapes
    if shapes.inverse:
        names = ", ".join(sorted(map(str, shapes.inverse)))
        raise _problem(f"the symbols {names} are read from input dims that are expressions of them; a bundle binds "
                       f"each symbol from an input dim that is the symbol alone")
    opt = shapes.opt_binding()
    refs: dict[fx.Node, tuple[int, int]] = {}
    inputs: list[tuple[str, Any, list[int]]] = []
    input_symbols: list[tuple[int, int, str, int, int]] = []
    steps: list[tuple[str, int, list[tuple[int, int]]]] = []
    engines: list[bytes] = []
    ranges: list[tuple[int, dict[str, int], Any, dict[str, int]]] = []
    in_pytorch: list[fx.Node] = []
    outputs: list[tuple[str, tuple[int, int], Any, list[int]]] = []
    output_symbols: list[tuple[int, int, str, int, int]] = []

    def symbolic_type(node: fx.Node, what: str, marks: list[tuple[int, int, str, int, int]], index: int
                      ) -> tuple[Any, list[int]]:
        val, dtype = _tensor_value(node, what)
        shape = []
        for d, size in enumerate(val.shape):
            expr = sympy.sympify(size.node.expr) if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
            shape.append(int(expr.subs(opt)))
            if isinstance(expr, sympy.Symbol) and expr in shapes.ranges:
                r = shapes.ranges[expr]
                marks.append((index, d, r.name, r.min, r.max))
        return dtype, shape

    for node in glue.graph.nodes:
        if node.op == "placeholder":
            refs[node] = (-1, len(inputs))
            inputs.append((node.name, *symbolic_type(node, f"input '{node.name}'", input_symbols, len(inputs))))
        elif node.op == "call_module" and isinstance(glue.get_submodule(str(node.target)), Specializations):
            continue
        elif node.op == "call_module" and isinstance(glue.get_submodule(str(node.target)), DynamicBlock):
            b = table.blocks[glue.get_submodule(str(node.target)).index]
            r = table.ranges.get(b.index)
            if r is not None:
                runner = r.parent
                ranges.append((len(engines), dict(r.built_at), r.program, {str(s): v for s, v in r.pinned.items()}))
            elif not b.symbols:
                runner = next(iter(table.live.values())).runners[b.index]
            else:
                raise _problem(f"block {b.index} ({_ops_text(b.histogram)}) has no engine for the whole range: its "
                               f"plans differ from size to size (kiln.compile's log names the difference), so it "
                               f"builds an engine per size, which a bundle cannot do")
            if not isinstance(runner, KilnEngineModule) or runner._casts:
                raise _problem(f"block {b.index} runs {type(runner).__name__} with dtype conversions around its "
                               f"engine, which a bundle does not make; compile the model in float32")
            args = []
            for a in node.args[1:]:
                if a not in refs:
                    raise _problem(f"block {b.index} takes '{a}', which is not a program input or an engine output; "
                                   f"{_HINT}")
                args.append(refs[a])
            refs[node] = (len(steps), 0)
            steps.append((f"block {b.index}", len(engines), args))
            engines.append(runner.engine_bytes())
        elif node.op == "call_function" and node.target is operator.getitem and node.args[0] in refs \
                and refs[node.args[0]][0] >= 0:
            refs[node] = (refs[node.args[0]][0], int(node.args[1]))
        elif node.op == "output":
            for i, out in enumerate(pytree_leaves(node.args[0])):
                if not isinstance(out, fx.Node) or out not in refs:
                    raise _problem(f"output {i} is '{out}', not a value a Kiln bundle computes; {_HINT}")
                outputs.append((f"result_{i}", refs[out], *symbolic_type(out, f"output {i}", output_symbols, i)))
        else:
            in_pytorch.append(node)
    _refuse_pytorch_nodes(in_pytorch)
    if not engines:
        raise _problem(f"the program has no Kiln engine; {_HINT}")
    return _C.write_bundle(engines, inputs, steps, outputs, input_symbols, output_symbols, ranges)


def _refuse_pytorch_nodes(in_pytorch: list[fx.Node]) -> None:
    """Raises naming the ops (or the first other node) of the program that run in PyTorch."""
    ops = [n for n in in_pytorch if n.op == "call_function"]
    if ops:
        names = ", ".join(f"{_op_name(n)} (node '{n.name}')" for n in ops[:20])
        more = f" and {len(ops) - 20} more" if len(ops) > 20 else ""
        raise _problem(f"{len(ops)} op(s) of the program run in PyTorch, which a Kiln bundle cannot hold: "
                       f"{names}{more}; {_HINT}")
    if in_pytorch:
        raise _problem(f"the program has {in_pytorch[0].op} node '{in_pytorch[0].name}', which a Kiln bundle cannot "
                       f"hold; {_HINT}")


def _ops_text(histogram: Any) -> str:
    return ", ".join(f"{n} x {op}" for op, n in histogram.most_common(3))
