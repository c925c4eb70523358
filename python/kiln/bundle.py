"""Kiln bundles: a compiled program in one file that kiln-run and the C++ runtime run without Python.

    kiln.save(compiled, "model.kiln", arg_inputs=[x], output_format="kiln_bundle")
    # kiln-run model.kiln --inputs x.npy          or, in C++, kiln::Bundle::load("model.kiln")

A bundle holds the engines of a program saved by kiln.save and its glue: the program's inputs
(the tensor leaves of ``(args, kwargs)``, flattened in order), the engine calls in order with the
values each takes, and which values are the program's outputs (flattened). Nothing else runs:
a program with ops left to PyTorch cannot be bundled, and :func:`write_bundle` raises
``kiln.UnsupportedError`` naming them. The byte layout is in src/runtime/bundle_file.h; the C++
API in include/kiln/bundle.h; docs/deploy.md says how to build against it.
"""

from __future__ import annotations

import json
import operator
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from kiln import _C
from kiln._logging import get_logger
from kiln.archive import engine_blobs
from kiln.translate import EncodeError, kiln_dtype

log = get_logger("bundle")

__all__ = ["write_bundle", "bundle_bytes"]

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
    log.info("kiln bundle: %s: %d bytes", target, len(data))
    return program


def _problem(text: str) -> _C.UnsupportedError:
    return _C.UnsupportedError(f"kiln.save(output_format='kiln_bundle'): {text}")


def _tensor(node: fx.Node, what: str) -> tuple[Any, list[int]]:
    """The Kiln dtype and static shape of a program input or output."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise _problem(f"{what} is a {type(val).__name__}, not a tensor; a Kiln bundle's inputs and outputs are "
                       f"tensors")
    try:
        dtype = kiln_dtype(val.dtype)
    except EncodeError as err:
        raise _problem(f"{what}: {err}") from None
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

    ops = [n for n in in_pytorch if n.op == "call_function"]
    if ops:
        names = ", ".join(f"{_op_name(n)} (node '{n.name}')" for n in ops[:20])
        more = f" and {len(ops) - 20} more" if len(ops) > 20 else ""
        raise _problem(f"{len(ops)} op(s) of the program run in PyTorch, which a Kiln bundle cannot hold: "
                       f"{names}{more}; {_HINT}")
    if in_pytorch:
        raise _problem(f"the program has {in_pytorch[0].op} node '{in_pytorch[0].name}', which a Kiln bundle cannot "
                       f"hold; {_HINT}")
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
