"""Ahead-of-time entry points: compile, save, load.

    compiled = kiln.compile(model_or_exported_program, arg_inputs=[x], **settings)
    kiln.save(compiled, "model.ep", arg_inputs=[x])     # a torch.export ExportedProgram
    program = kiln.load("model.ep")                      # in any process; program.module()(x)
    kiln.extract_engines("model.ep", "engines/")         # engine_0.kiln ... for kiln-run

kiln.load runs no code from the file unless told the file is trusted, and checks every engine
in it (kiln/archive.py). A dynamic-shape program is saved as its symbolic ExportedProgram with
the engines of the sizes built so far (kiln/dynamic.py); kiln.load returns a
:class:`DynamicProgram`, whose ``.module()`` serves those sizes with no build and builds others
on first use.

The pipeline after lowering is kiln/pipeline.py, shared with the Dynamo backend.
In a saved program each engine is a call of ``kiln::execute_engine`` whose engine bytes are a
uint8 buffer of the program.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln import _C
from kiln._logging import debug_logging, get_logger
from kiln.archive import check_archive, engine_blobs
from kiln.archive import check_engines as check_engines_of
from kiln.control_flow import export_form
from kiln.dynamic import (
    SAVED_DESCRIPTION,
    SAVED_ENGINES,
    compile_dynamic,
    dynamic_program_of,
    input_dynamic_shapes,
    is_dynamic,
    read_saved,
)
from kiln.lowering import export_module, lower_exported_program
from kiln.outputs import OutputTemplate, output_hint, unregistered_output
from kiln.pipeline import (
    CompileSummary,
    compile_lowered,
    device_of,
    graph_runner,
    runs_again_alike,
    supported_targets,
    unflattener,
)
from kiln.program_cache import ProgramCache, WarmStart
from kiln.refit import WeightWatch, follow_weights
from kiln.runtime import KilnEngineModule, warm_up
from kiln.settings import CompilationSettings, settings_from_options

log = get_logger("compile")

__all__ = ["compile", "save", "load", "extract_engines", "KilnModule", "DynamicProgram"]


class KilnModule(torch.nn.Module):
    """A compiled program: flattens (args, kwargs) like the exported program, runs the graph.

    It follows the model's weights: a weight changed in place since the engines took it (see
    kiln.refit.WeightWatch) is refitted into them at the next call, or, for engines built with
    ``immutable_weights=True``, the call raises ``kiln.UnsupportedError``. Compiled with
    ``share_weights=False`` it is a snapshot of the model and checks nothing.
    """

    def __init__(self, gm: fx.GraphModule, in_spec: pytree.TreeSpec | None, out_spec: pytree.TreeSpec | None,
                 immutable_weights: bool = False, out_template: OutputTemplate | None = None) -> None:
        super().__init__()
        self._in_spec = in_spec
        self._out_spec = out_spec
        self._out_template = out_template
        self.immutable_weights = immutable_weights
        sources = gm.meta.pop("kiln_weight_sources", None) or {}  # not kept in meta, which pickles
        self.weight_watch: WeightWatch | None = WeightWatch(sources) if sources else None
        # Called with positional leaves only (the common case), flattening is the identity.
        self._positional = in_spec is not None and in_spec == pytree.tree_flatten(
            (tuple(range(in_spec.num_leaves)), {}))[1]
        self._unflatten = self._output_builder()
        self._use_graph(gm)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        watch = self.weight_watch
        # A graph that runs again alike (pipeline.runs_again_alike) is launched first and its
        # weights checked while the device works; any other graph follows them before it runs.
        check_after = self._checks_after_launch
        if watch is not None and not check_after and watch.changed():
            self.follow_weights()
        if self._positional and self._in_spec is not None and not kwargs and len(args) == self._in_spec.num_leaves \
                and all(isinstance(a, torch.Tensor) for a in args):
            flat: Sequence[Any] = args
        else:
            flat, spec = pytree.tree_flatten((args, kwargs))
            if self._in_spec is not None and spec != self._in_spec:
                raise ValueError(f"Kiln module called with inputs structured as {spec}, "
                                 f"compiled for {self._in_spec}")
        out = self._run(*flat)
        if check_after and watch is not None and watch.changed():
            self.follow_weights()
            out = self._run(*flat)
        return self._unflatten(out)

    def _output_builder(self) -> Callable[[Sequence[Any]], Any]:
        unflatten, template = unflattener(self._out_spec), self._out_template
        if template is None:
            return unflatten
        return lambda flat: template.rebuild(unflatten(flat))

    def _use_graph(self, gm: fx.GraphModule) -> None:
        """Runs ``gm``. The runner is kept outside the module tree: as a second name of ``gm`` it
        would give torch.export (kiln.save) every engine and constant twice."""
        self.gm = gm
        self._modules.pop("_run", None)
        self.__dict__["_run"] = graph_runner(gm)
        self._checks_after_launch = runs_again_alike(gm)

    def follow_weights(self) -> None:
        """Refits the engines now with the model's weights that changed in place (nothing when
        none did). Calls do this by themselves; see the class docstring."""
        if self.weight_watch is not None and self.weight_watch.changed():
            follow_weights(self.weight_watch, self.gm, self.immutable_weights, f"Kiln {self.summary.graph_name}")

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("immutable_weights", False)
        state.setdefault("weight_watch", None)
        state.setdefault("_out_template", None)
        super().__setstate__(state)
        self._unflatten = self._output_builder()
        self._use_graph(self.gm)

    def __getstate__(self) -> dict[str, Any]:
        # A copy is a snapshot: it holds the engines with the weights they have now (the model's
        # current ones, followed first) and follows no model.
        self.follow_weights()
        state = dict(self.__dict__)
        state.pop("_unflatten", None)
        state.pop("_run", None)
        state["weight_watch"] = None
        return state

    def engines(self) -> list[KilnEngineModule]:
        return [m for m in self.modules() if isinstance(m, KilnEngineModule)]

    @property
    def summary(self) -> CompileSummary:
        return self.gm.meta["kiln_summary"]


def _check_examples(arg_inputs: Any, kwarg_inputs: Any) -> None:
    """Example inputs are a list or tuple (and a dict) of tensors, Python scalars, None, or pytree
    containers of them: a lone tensor or a numpy array is a clear error here, not a puzzle later."""
    if arg_inputs is not None and not isinstance(arg_inputs, (list, tuple)):
        hint = " (pass [x])" if isinstance(arg_inputs, torch.Tensor) else ""
        raise TypeError(f"kiln.compile: arg_inputs must be a list or tuple of example inputs, got a "
                        f"{type(arg_inputs).__name__}" + hint)
    if kwarg_inputs is not None and not isinstance(kwarg_inputs, dict):
        raise TypeError(f"kiln.compile: kwarg_inputs must be a dict, got a {type(kwarg_inputs).__name__}")
    leaves, _ = pytree.tree_flatten((list(arg_inputs or ()), dict(kwarg_inputs or {})))
    for leaf in leaves:
        if not isinstance(leaf, (torch.Tensor, int, float, bool, str, type(None), torch.dtype, torch.device)):
            module = type(leaf).__module__
            hint = " (convert it with torch.from_numpy)" if module == "numpy" else ""
            raise TypeError(f"kiln.compile: an example input is a {module}.{type(leaf).__qualname__}, not a "
                            f"torch.Tensor{hint}")


def compile(module: torch.nn.Module | torch.export.ExportedProgram, arg_inputs: Sequence[Any] | None = None,
            kwarg_inputs: dict[str, Any] | None = None, *, settings: CompilationSettings | None = None,
            inputs: Sequence[Any] | None = None, ir: str = "default", dynamic_shapes: Any = None,
            **options: Any) -> KilnModule:
    """Compiles a module (exported with torch.export on ``arg_inputs``) or an ExportedProgram.

    ``inputs`` and ``ir`` take ``torch_tensorrt.compile``'s spelling: ``inputs`` is ``arg_inputs``
    (example tensors, or ``kiln.Input`` min/opt/max shapes), and ``ir`` may be "default" or
    "dynamo" (this torch.export path). ``dynamic_shapes`` is torch.export's: the sizes it names
    (``torch.export.Dim("b", min=1, max=32)``, ``Dim.AUTO``, ...) stay symbolic, and the program
    serves every size in their ranges (kiln/dynamic.py; so does an ExportedProgram with symbolic
    sizes)."""
    if ir not in ("default", "dynamo"):
        raise ValueError(f"kiln.compile: ir={ir!r} is not supported; kiln.compile is the torch.export (\"dynamo\") "
                         "path, and torch.compile(module, backend=\"kiln\") is the torch_compile one")
    if inputs is not None:
        if arg_inputs is not None:
            raise ValueError("kiln.compile: give the example inputs once, as arg_inputs or as inputs")
        arg_inputs = inputs
    settings = settings_from_options(settings, **options)
    if not isinstance(module, (torch.nn.Module, torch.export.ExportedProgram)):
        raise TypeError(f"kiln.compile compiles a torch.nn.Module or a torch.export.ExportedProgram, "
                        f"got a {type(module).__name__}")
    if isinstance(arg_inputs, (list, tuple)):
        arg_inputs, input_shapes = input_dynamic_shapes(
            arg_inputs, settings.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if input_shapes is not None:
            if dynamic_shapes is not None:
                raise ValueError("kiln.compile: give the dynamic shapes once, as dynamic_shapes or as kiln.Input "
                                 "ranges in the inputs")
            dynamic_shapes = input_shapes
    if dynamic_shapes is not None and isinstance(module, torch.export.ExportedProgram):
        raise ValueError("kiln.compile: dynamic_shapes is for a module that kiln.compile exports; an "
                         "ExportedProgram keeps the dynamic shapes it was exported with")
    _check_examples(arg_inputs, kwarg_inputs)
    with debug_logging(settings.debug), torch.no_grad():
        keep = supported_targets()
        if not settings.builds_nothing and arg_inputs is not None:
            try:  # the device's libraries set themselves up while torch.export traces
                warm_up(device_of(settings, list(arg_inputs)))
            except ValueError:
                pass  # inputs on several devices: reported below, after lowering
        template: OutputTemplate | None = None
        warm: WarmStart | None = None
        if isinstance(module, torch.export.ExportedProgram):
            ep = module
        else:
            if arg_inputs is None:
                raise ValueError("kiln.compile needs arg_inputs (example inputs) to trace a module")
            # Warm start: a program found by the module's own key skips torch.export as well
            # (static programs: the program cache keeps no dynamic ones).
            if dynamic_shapes is None:
                warm = WarmStart.for_module(module, list(arg_inputs), kwarg_inputs, keep, settings,
                                            type(module).__name__)
                warm_hit = warm.load() if warm is not None else None
                if warm_hit is not None:
                    return KilnModule(warm_hit.gm, warm_hit.in_spec, warm_hit.out_spec, settings.immutable_weights)
            ep, template = export_module(module, list(arg_inputs), kwarg_inputs, dynamic_shapes)
        graph_name = type(module).__name__
        if dynamic_shapes is not None and not is_dynamic(ep.graph_module):
            log.warning("kiln.compile: torch.export made every dynamic dim static (it specializes an example size "
                        "of 0 or 1, and a dim the program fixes); the program serves the example's shapes only")
        if is_dynamic(ep.graph_module):  # one symbolic program; the program cache keeps static ones
            lowered = lower_exported_program(ep, keep, fold_weights=settings.immutable_weights)
            examples = [n.meta.get("val") for n in lowered.gm.graph.nodes if n.op == "placeholder"]
            gm = compile_dynamic(lowered, settings, device_of(settings, examples), graph_name,
                                 lowered.range_constraints)
            table = dynamic_program_of(gm)
            if table is not None:
                table.keep_source(ep)  # what kiln.save writes
            return KilnModule(gm, lowered.in_spec, lowered.out_spec, settings.immutable_weights, template)
        # A program cache hit (kiln/program_cache.py) skips lowering, partitioning and building;
        # a program whose output Kiln flattens itself (kiln/outputs.py) is not cached.
        programs = None if template is not None else warm.program_cache(ep, keep) if warm is not None else \
            ProgramCache.for_exported_program(ep, keep, settings, graph_name)
        hit = programs.load({**ep.constants, **ep.state_dict}) if programs is not None else None
        if hit is not None:
            if warm is not None:
                warm.remember(programs, ep)
            return KilnModule(hit.gm, ep.call_spec.in_spec, ep.call_spec.out_spec, settings.immutable_weights)
        lowered = lower_exported_program(ep, keep, fold_weights=settings.immutable_weights)
        examples = [n.meta.get("val") for n in lowered.gm.graph.nodes if n.op == "placeholder"]
        device = device_of(settings, examples)
        gm = programs.compile(lowered, device) if programs is not None else \
            compile_lowered(lowered, settings, device, graph_name=graph_name)
        if warm is not None:
            warm.remember(programs, ep)
    return KilnModule(gm, lowered.in_spec, lowered.out_spec, settings.immutable_weights, template)


def _engine_modules(module: torch.nn.Module) -> list[KilnEngineModule]:
    return [m for m in module.modules() if isinstance(m, KilnEngineModule)]


_OUTPUT_FORMATS = ("exported_program", "kiln_bundle")


def save(module: torch.nn.Module, path: str | os.PathLike[str], arg_inputs: Sequence[Any],
         kwarg_inputs: dict[str, Any] | None = None, *,
         output_format: str = "exported_program") -> torch.export.ExportedProgram:
    """Exports a compiled module (engines as kiln::execute_engine calls) and saves it: as a
    torch.export program read by kiln.load (``output_format="exported_program"``), or as a Kiln
    bundle that kiln-run and the C++ runtime run without Python (``"kiln_bundle"``, kiln/bundle.py:
    raises kiln.UnsupportedError naming any op left to PyTorch).

    A dynamic-shape program (kiln.compile with ``dynamic_shapes`` or kiln.Input ranges) is saved
    as its symbolic ExportedProgram with the engines of the sizes built so far (returned: the
    symbolic program; ``arg_inputs`` and ``kwarg_inputs`` are not used). Its bundle holds, per
    block, the engine its instances run on and the block's fitted sizes (kiln/instances.py), so
    that kiln-run and ``kiln::Bundle::at`` serve any size in the ranges."""
    if output_format not in _OUTPUT_FORMATS:
        raise ValueError(f"kiln.save: unknown output_format {output_format!r}; expected one of "
                         f"{', '.join(repr(f) for f in _OUTPUT_FORMATS)}")
    for m in module.modules():
        if isinstance(m, KilnModule):
            m.follow_weights()  # the engines saved hold the model's current weights
    if dynamic_program_of(module) is not None:
        return _save_dynamic(module, os.fspath(path), output_format)
    engines = _engine_modules(module)
    if not engines:
        log.warning("kiln.save: the module contains no Kiln engine; saving a plain exported program")
    swapped: list[tuple[KilnModule, fx.GraphModule]] = []
    try:
        for e in engines:
            e.set_exporting(True)
        for m in list(module.modules()):
            exported = export_form(m.gm) if isinstance(m, KilnModule) else None
            if exported is not None:  # control flow: its branches take their tensors as operands
                swapped.append((m, m.gm))
                m._use_graph(exported)
        with torch.no_grad():
            try:
                ep = torch.export.export(module, tuple(arg_inputs), kwarg_inputs or {}, strict=False)
            except RuntimeError as err:
                kind = unregistered_output(err)
                if kind is None:
                    raise
                raise TypeError(f"kiln.save: the module returns a {kind}, which torch.export cannot save (it is "
                                f"not a registered pytree); {output_hint(kind)}") from None
    finally:
        for m, gm in swapped:
            m._use_graph(gm)
        for e in engines:
            e.set_exporting(False)
    if output_format == "kiln_bundle":
        from kiln.bundle import write_bundle  # kiln.bundle calls save for a module
        return write_bundle(ep, path)
    with open(os.fspath(path), "wb") as f:  # a file object: torch warns about a path not ending in .pt2
        torch.export.save(ep, f)
    return ep


def _save_dynamic(module: torch.nn.Module, path: str, output_format: str) -> torch.export.ExportedProgram:
    """kiln.save of a dynamic-shape program: its symbolic ExportedProgram, the engines of its live
    specializations and their description, in one torch.export archive (kiln/dynamic.py)."""
    table = dynamic_program_of(module)
    if not isinstance(module, KilnModule) or table is None or dynamic_program_of(module.gm) is not table:
        raise _C.UnsupportedError("kiln.save: a dynamic-shape program is saved as the module kiln.compile returned, "
                                  "not inside another module")
    if output_format == "kiln_bundle":  # its engines over the ranges, run by kiln-run and Bundle::at
        from kiln.bundle import dynamic_bundle_bytes, write_file
        data = dynamic_bundle_bytes(module.gm)
        write_file(path, data)
        log.info("kiln.save: %s: bundle of a dynamic-shape program, %d bytes", path, len(data))
        return table.__dict__["source_program"]
    from torch.export.pt2_archive._package import package_pt2
    ep, engines, description = table.saved_form()
    with open(path, "wb") as f:  # a file object: torch warns about a path not ending in .pt2
        package_pt2(f, exported_programs={"model": ep, SAVED_ENGINES: engines},
                    extra_files={SAVED_DESCRIPTION: description})
    log.info("kiln.save: %s: dynamic-shape program with %d specialization(s), %d engine(s)", path, len(table.live),
             len(engines.state_dict))
    return ep


class DynamicProgram:
    """What kiln.load returns for a saved dynamic-shape program: ``.module()`` is the compiled
    module (the same one each call), which serves the saved sizes with the saved engines and
    builds the engines of other sizes in the ranges on their first call (sizes outside the
    ranges raise kiln.ShapeRangeError, as before saving). ``exported_program`` is the symbolic
    ExportedProgram it was compiled from."""

    def __init__(self, module: KilnModule, exported_program: torch.export.ExportedProgram) -> None:
        self._module = module
        self.exported_program = exported_program

    def module(self) -> KilnModule:
        return self._module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)


def load(path: str | os.PathLike[str], *, trusted: bool = False) -> torch.export.ExportedProgram | DynamicProgram:
    """Loads a program saved by kiln.save (call ``.module()`` on it to run it).

    Nothing in the file runs: parts that torch.export would unpickle unsafely or evaluate raise
    ``UnsafeFileError`` naming them (kiln/archive.py), unless ``trusted=True`` (files you made
    or trust: their pickles are loaded as torch.export does). Every embedded engine is
    deserialized and checked here, so a damaged one raises its ``kiln.EngineFileError`` (one that
    cannot be read at all, ``kiln.CorruptedError``) from this call, not from the first run.

    A static program loads as an ExportedProgram; a dynamic-shape one as a :class:`DynamicProgram`
    (its symbolic program lowered and partitioned again, its saved engines checked and installed)."""
    path = os.fspath(path)
    ep, dynamic = _read(path, trusted)
    if dynamic is None:
        engines = check_engines_of(ep, path)
        log.info("kiln.load: %s: %d engine(s)%s", path, engines, " (trusted)" if trusted else "")
        return ep
    return _load_dynamic(ep, *dynamic, path)


def _load(path: str, trusted: bool, check_engines: bool) -> torch.export.ExportedProgram:
    ep, dynamic = _read(path, trusted)
    if dynamic is not None:
        raise _C.UnsupportedError(f"kiln.extract_engines: {path} is a dynamic-shape program, whose engines are per "
                                  "concrete shape and run only inside it (kiln.load serves it); kiln-run runs the "
                                  "engines of a program compiled with static shapes")
    engines = check_engines_of(ep, path) if check_engines else 0
    log.info("kiln.load: %s: %d engine(s)%s", path, engines, " (trusted)" if trusted else "")
    return ep


def _read(path: str, trusted: bool) -> tuple[torch.export.ExportedProgram, tuple[Any, Any] | None]:
    """The saved program, and for a dynamic-shape one its description and engine program."""
    if not isinstance(trusted, bool):
        raise TypeError(f"kiln.load: trusted must be a bool, got {trusted!r}")
    dynamic: tuple[Any, Any] | None = None
    try:
        with open(path, "rb") as f:  # one open file for the check and the load: the bytes checked are those read
            if not trusted:
                check_archive(f, path)
                f.seek(0)
            is_dynamic_file = _holds(f, f"extra/{SAVED_DESCRIPTION}")
            f.seek(0)
            try:
                if is_dynamic_file:
                    from torch.export.pt2_archive._package import load_pt2
                    contents = load_pt2(f)
                    ep = contents.exported_programs["model"]
                    dynamic = (contents.extra_files.get(SAVED_DESCRIPTION),
                               contents.exported_programs.get(SAVED_ENGINES))
                else:
                    ep = torch.export.load(f)
                # What ep.module() needs: a damaged module_call_graph loads, then fails at first use.
                if ep.call_spec.in_spec is None or ep.call_spec.out_spec is None:
                    raise ValueError("the program has no call signature")
            except Exception as err:  # noqa: BLE001 - any failure of torch's reader is a file it cannot read
                raise _C.CorruptedError(f"kiln.load: {path} is damaged or not a program saved by kiln.save: "
                                        f"torch.export could not read it ({type(err).__name__}: {err})") from err
    except IsADirectoryError:
        raise _C.IoError(f"kiln.load: {path} is a directory, not a saved program") from None
    return ep, dynamic


def _holds(f: Any, name: str) -> bool:
    """Whether the archive ``f`` has a record ``name`` (False when it cannot be read: torch's
    reader then says why)."""
    from torch.export.pt2_archive._package import PT2ArchiveReader
    try:
        return name in PT2ArchiveReader(f).get_file_names()
    except Exception:  # noqa: BLE001 - whatever damaged bytes make the reader raise
        return False


def _load_dynamic(ep: torch.export.ExportedProgram, description: Any, engines: Any, path: str) -> DynamicProgram:
    """Compiles the saved symbolic program again, as kiln.compile did, with the saved engines
    installed instead of built (kiln/dynamic.py checks that the partition is the saved one)."""
    saved = read_saved(description, engines, path)
    settings = saved.settings
    with debug_logging(settings.debug), torch.no_grad():
        try:
            lowered = lower_exported_program(ep, supported_targets(), fold_weights=settings.immutable_weights)
        except Exception as err:  # noqa: BLE001 - a program torch read but Kiln cannot lower
            raise _C.CorruptedError(f"kiln.load: {path}: torch cannot lower the saved dynamic-shape program again "
                                    f"({type(err).__name__}: {err})") from err
        if not is_dynamic(lowered.gm):
            raise _C.CorruptedError(f"kiln.load: {path} is damaged or not a program saved by kiln.save: it describes "
                                    "a dynamic-shape program, but its program has no symbolic size")
        examples = [n.meta.get("val") for n in lowered.gm.graph.nodes if n.op == "placeholder"]
        gm = compile_dynamic(lowered, settings, device_of(settings, examples), saved.graph_name,
                             lowered.range_constraints, saved=saved)
    table = dynamic_program_of(gm)
    assert table is not None, "a dynamic program that builds engines has a Specializations table"
    table.keep_source(ep)  # it can be saved again
    log.info("kiln.load: %s: dynamic-shape program, %d saved specialization(s)", path, len(table.live))
    return DynamicProgram(KilnModule(gm, lowered.in_spec, lowered.out_spec, settings.immutable_weights), ep)


def extract_engines(program: str | os.PathLike[str] | torch.export.ExportedProgram,
                    out_dir: str | os.PathLike[str], *, trusted: bool = False) -> list[Path]:
    """Writes every engine of a saved program as ``engine_<i>.kiln`` (runnable by kiln-run)."""
    ep = program if isinstance(program, torch.export.ExportedProgram) else \
        _load(os.fspath(program), trusted, check_engines=False)  # kiln-run checks the engines it loads
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for _, blob in engine_blobs(ep):
        path = out / f"engine_{len(paths)}.kiln"
        path.write_bytes(blob.detach().cpu().contiguous().numpy().tobytes())
        paths.append(path)
    return paths
