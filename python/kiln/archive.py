"""What kiln.load checks in a saved program before and after torch.export reads it.

``torch.export.load`` runs code from a file in several places: it unpickles the example inputs
(``data/sample_inputs/<model>.pt``, retried with ``weights_only=False`` when PyTorch's
restricted unpickler refuses them), every weight or constant marked ``use_pickle`` (a tensor
subclass, read with ``weights_only=False``), custom and opaque objects among the constants
(TorchScript's and Python's unpickler) and the pickled state dicts of older layouts; it parses
symbolic shape expressions with sympy's ``sympify``, which evaluates them as Python; and it
loads the AOTInductor libraries packaged beside a program. :func:`check_archive` reads the
archive with the reader torch uses and refuses each of those (:class:`UnsafeFileError`, naming
the entry), unless the caller trusts the file. Example inputs are accepted when the restricted
unpickler (``weights_only=True``) reads them: torch then takes that same path.

After loading, :func:`check_engines` deserializes every embedded engine (checksums, bounds,
every shape rule) and compares its I/O with the call's spec, so a damaged engine is an error of
kiln.load, not of the first call; the engines it made serve the program's first calls.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

import torch

from kiln import _C
from kiln._logging import get_logger
from kiln.runtime import adopt_engine, spec_error

log = get_logger("load")

__all__ = ["UnsafeFileError", "check_archive", "check_engines", "engine_blobs"]

_TRUST_HINT = "pass trusted=True only for a file you trust"
# A shape expression torch writes: symbols (s0, u3), numbers, arithmetic, comparisons and the
# functions named below, as plain text ("s0 + 2") or as sympy's srepr, which torch.export.save
# writes ("Add(Symbol('s0', positive=True, integer=True), Integer(2))"): the classes, quoted
# symbol names and numbers, and assumption keywords. Anything else (other names, attributes,
# other strings) could run code in sympify.
_EXPR_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|(\d+(?:\.\d+)?(?:e[+-]?\d+)?)|(\*\*|[-+*/%(),<>=!&|~])"
                         r"|'([a-z]+\d+|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)')")
_EXPR_FUNCTIONS = frozenset({
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity", "Max", "Min", "Abs", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not",
    "True", "False", "oo", "floor", "ceiling",
    # sympy's srepr: its classes and constants, and the assumptions a Symbol is written with
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Equality", "Unequality", "StrictLessThan",
    "LessThan", "StrictGreaterThan", "GreaterThan", "true", "false", "int_oo", "zoo", "nan", "precision",
    "positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite", "infinite", "zero",
    "nonzero", "commutative", "rational", "even", "odd", "extended_real", "extended_positive",
    "extended_negative", "extended_nonnegative", "extended_nonpositive", "extended_nonzero"})
_SYMBOL = re.compile(r"[a-z]+\d+")


class UnsafeFileError(_C.KilnError):
    """kiln.load refused part of a file that loading would unpickle or evaluate (code could run)."""


def _corrupted(path: str, what: str) -> _C.CorruptedError:
    return _C.CorruptedError(f"kiln.load: {path} is damaged or not a program saved by kiln.save: {what}")


def _safe_expression(text: str) -> bool:
    pos = 0
    while pos < len(text):
        m = _EXPR_TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            return text[pos:].strip() == ""
        name = m.group(1)
        if name is not None and name not in _EXPR_FUNCTIONS and not _SYMBOL.fullmatch(name):
            return False
        pos = m.end()
    return True


def _expressions(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr_str":
                yield value
            else:
                yield from _expressions(value)
    elif isinstance(node, list):
        for value in node:
            yield from _expressions(value)


def _json(reader: Any, name: str, path: str) -> Any:
    try:
        return json.loads(reader.read_string(name))
    except (RuntimeError, ValueError) as err:  # unreadable record, bad UTF-8 or bad JSON
        raise _corrupted(path, f"{name} is not readable JSON ({err})") from None


def _check_payloads(reader: Any, name: str, kind: str, path: str) -> None:
    """A weights or constants config: every entry must be a plain tensor's bytes."""
    doc = _json(reader, name, path)
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise _corrupted(path, f"{name} has no 'config' table")
    for fqn, meta in config.items():
        if not isinstance(meta, dict):
            raise _corrupted(path, f"{name}: the entry of '{fqn}' is not a table")
        file = str(meta.get("path_name", ""))
        if kind == "constant" and not file.startswith("tensor_"):
            raise UnsafeFileError(f"kiln.load refused {path}: constant '{fqn}' ({file}) is a pickled object, not a "
                                  f"tensor, which loading would unpickle; {_TRUST_HINT}")
        if meta.get("use_pickle"):
            raise UnsafeFileError(f"kiln.load refused {path}: {kind} '{fqn}' ({file}) is stored as a pickle (a tensor "
                                  f"subclass), which loading would unpickle with weights_only=False; {_TRUST_HINT}")


def _check_example_inputs(reader: Any, name: str, path: str) -> None:
    data = reader.read_bytes(name)
    if not data:
        return
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err):
            raise UnsafeFileError(f"kiln.load refused {path}: the example inputs ({name}) hold objects other than "
                                  f"tensors and plain values, which loading would unpickle with weights_only=False; "
                                  f"{_TRUST_HINT}") from None
        raise _corrupted(path, f"the example inputs ({name}) cannot be read ({err})") from None
    except Exception as err:  # noqa: BLE001 - whatever damaged bytes make the reader raise
        raise _corrupted(path, f"the example inputs ({name}) cannot be read ({type(err).__name__}: {err})") from None


def check_archive(f: BinaryIO, path: str) -> None:
    """Refuses what ``torch.export.load`` would unpickle unsafely or evaluate (see the module
    docstring); raises kiln.CorruptedError for an archive it cannot read."""
    from torch.export.pt2_archive._package import PT2ArchiveReader
    try:
        reader = PT2ArchiveReader(f)
        names = list(reader.get_file_names())
    except Exception as err:  # noqa: BLE001 - whatever damaged bytes make the reader raise
        raise _corrupted(path, f"not a readable torch.export archive ({err}); an archive of torch's older "
                               f"layout holds pickles: {_TRUST_HINT}") from None
    models = [n[len("models/"):-len(".json")] for n in names if n.startswith("models/") and n.endswith(".json")]
    if not models:
        raise _corrupted(path, "the archive holds no program (models/*.json)")
    if any(n.startswith("data/aotinductor/") for n in names):
        raise UnsafeFileError(f"kiln.load refused {path}: it packages AOTInductor libraries, which loading would "
                              f"run; {_TRUST_HINT}")
    for model in models:
        for legacy in (f"data/weights/{model}.pt", f"data/constants/{model}.pt"):
            if legacy in names:
                raise UnsafeFileError(f"kiln.load refused {path}: {legacy} is a pickled state dict (an older layout), "
                                      f"which loading would unpickle with weights_only=False; {_TRUST_HINT}")
        for config, kind in ((f"data/weights/{model}_weights_config.json", "weight"),
                             (f"data/constants/{model}_constants_config.json", "constant")):
            if config in names:
                _check_payloads(reader, config, kind, path)
        inputs = f"data/sample_inputs/{model}.pt"
        if inputs in names:
            _check_example_inputs(reader, inputs, path)
        try:
            expressions = list(_expressions(_json(reader, f"models/{model}.json", path)))
        except RecursionError:
            raise _corrupted(path, f"models/{model}.json nests too deeply") from None
        for expr in expressions:
            if not isinstance(expr, str) or not _safe_expression(expr):
                raise UnsafeFileError(f"kiln.load refused {path}: the shape expression {str(expr)[:80]!r} of program "
                                      f"'{model}' is not plain arithmetic on symbols, and loading would evaluate it "
                                      f"as Python; {_TRUST_HINT}")


def engine_blobs(ep: torch.export.ExportedProgram) -> list[tuple[torch.fx.Node, torch.Tensor]]:
    """Every ``kiln::execute_engine`` call of the program with its engine bytes (uint8 tensor),
    those in the branches of a ``torch.cond`` included (their bytes are operands of the cond)."""
    sig = ep.graph_signature
    lookup = {**sig.inputs_to_buffers, **sig.inputs_to_parameters,
              **getattr(sig, "inputs_to_lifted_tensor_constants", {})}

    def state(name: str | None) -> Any:
        target = lookup.get(name) if name is not None else None
        return ep.state_dict.get(target) if target in ep.state_dict else ep.constants.get(target)

    found: list[tuple[torch.fx.Node, torch.Tensor]] = []
    _collect(ep.graph_module, lambda n: state(n.name) if n.op == "placeholder" else None, found, 0)
    return found


_MAX_NESTING = 64


def _collect(gm: torch.fx.GraphModule, value_of: Any, found: list[tuple[torch.fx.Node, torch.Tensor]],
             depth: int) -> None:
    """Adds the engine calls of ``gm`` and of its conds' branches; ``value_of(node)`` is the
    tensor a node of ``gm`` stands for, when it is a saved one."""
    if depth > _MAX_NESTING:
        raise _C.CorruptedError(f"kiln.load: the program nests more than {_MAX_NESTING} conds")
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target == torch.ops.kiln.execute_engine.default:
            blob = value_of(node.args[1]) if len(node.args) > 1 and isinstance(node.args[1], torch.fx.Node) else None
            if not isinstance(blob, torch.Tensor) or blob.dtype != torch.uint8:
                raise _C.CorruptedError(f"kiln.load: engine call {node.name} has no engine bytes")
            found.append((node, blob))
        elif node.target is torch.ops.higher_order.cond and len(node.args) == 4:
            operands = list(node.args[3]) if isinstance(node.args[3], (list, tuple)) else []
            for attr in node.args[1:3]:
                branch = getattr(gm, str(attr.target), None) if isinstance(attr, torch.fx.Node) else None
                if not isinstance(branch, torch.fx.GraphModule):
                    raise _C.CorruptedError(f"kiln.load: the cond {node.name} has no branch graph {attr}")
                inner = dict(zip([n for n in branch.graph.nodes if n.op == "placeholder"], operands))
                _collect(branch, lambda n, inner=inner: value_of(inner[n]) if isinstance(inner.get(n), torch.fx.Node)
                         else None, found, depth + 1)


def check_engines(ep: torch.export.ExportedProgram, path: str) -> int:
    """Deserializes each embedded engine (raising its kiln.EngineFileError, or CorruptedError for
    a spec that does not match it, naming the engine) and hands it to the runtime for the
    program's calls. Returns the number of engines."""
    blobs = engine_blobs(ep)
    for i, (node, blob) in enumerate(blobs):
        where = f"kiln.load: {path}: engine {i} ({node.name})"
        spec = node.args[2] if len(node.args) > 2 else None
        if not isinstance(spec, str):
            raise _C.CorruptedError(f"{where} has no spec")
        try:
            meta = json.loads(spec)
        except ValueError as err:
            raise _C.CorruptedError(f"{where}: its spec is not JSON ({err})") from None
        problem = spec_error(meta)
        if problem:
            raise _C.CorruptedError(f"{where}: {problem}")
        try:
            engine = _C.Engine.deserialize(blob.detach().cpu().contiguous().numpy(), meta["device"])
        except _C.KilnError as err:
            raise type(err)(f"{where}: {err}") from None
        problem = adopt_engine(blob, spec, engine)
        if problem:
            raise _C.CorruptedError(f"{where}: {problem}")
    return len(blobs)
