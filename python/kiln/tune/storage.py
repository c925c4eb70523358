"""Saved tunings: ``kiln.tune.save(model, path)`` / ``kiln.tune.load(model, path)``.

A saved tuning is a directory::

    <path>/tune.json                  the manifest (format "kiln.tune/1")
    <path>/artifacts/<i>-<name>.<j>.pt2   compiled programs of AOT choices (kiln.save files)
    <path>/artifacts/root.<j>.pt2         the whole-model choice's, when it is Kiln AOT

The manifest maps each wrapped module's path in the model ("" for a wrapped root) to its
choice (backend kind, name and config), the strategy and candidates it was tuned with, the tuning
config, its report, a digest of its structure, and for an AOT choice the artifact files with
their SHA-256 and the digest of the weights they hold. Its ``root`` holds the whole-model
decision the same way (``choice`` null: the wrappers' choices were kept); the wrappers a
whole-model choice superseded are marked so and keep no artifact. ``save`` writes a new directory
and swaps it in, so a reader sees the old tuning or the new one.

``load`` wraps the modules named in the manifest (those not wrapped yet) and restores each choice
without tuning: a JIT choice compiles at the module's first call, an AOT choice loads its
artifacts with ``kiln.load`` (which checks every engine) after checking their SHA-256. A module
whose artifact is missing, damaged or unreadable, or whose structure differs from the saved one,
is re-tuned, with a warning: on ``data`` when given, else at its first call. A module whose weights
differ from those its artifact holds compiles its choice again at its first call. A whole-model
choice is restored the same way, its superseded wrappers passing through; when it (or one of
them) cannot be restored, the whole model is tuned again, on ``data`` or at its first call.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kiln.tune.backends import Backend, backend_from_json
from kiln.tune.config import TuneConfig
from kiln.tune.fingerprint import device_name, sha256_file, structure_digest, versions, weights_digest
from kiln.tune.inputs import input_device
from kiln.tune.module import Choice, Module
from kiln.tune.results import ModuleReport
from kiln.tune.root import RootChoice, clear_root, install_root, root_choice
from kiln.tune.strategies import strategy_from_spec
from kiln.tune.tuner import tune, wrapped_modules

log = logging.getLogger("kiln.tune")

__all__ = ["save", "load", "MANIFEST", "FORMAT"]

MANIFEST = "tune.json"
FORMAT = "kiln.tune/1"


def _safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]", "_", name)[:64] or "root"


def _artifacts(backend: Backend, fn: Callable[..., Any] | None, module: torch.nn.Module, what: str,
               directory: Path, stem: str) -> tuple[list[dict[str, Any]], str | None]:
    """The files of a choice's compiled form with their SHA-256, and the digest of the weights they hold."""
    if not backend.saves_artifacts:
        return [], None
    if fn is None:
        raise ValueError(f"kiln.tune.save: {what}: its {backend.name} program is compiled at its next call; call "
                         "the model once before saving")
    records = backend.save_artifacts(fn, directory, stem)
    for record in records:
        record["sha256"] = sha256_file(directory / record["file"])
    return records, weights_digest(module)


def _entry(index: int, path: str, mod: Module, directory: Path) -> dict[str, Any]:
    choice = mod._choice
    if choice is None and not mod.superseded:
        raise ValueError(f"kiln.tune.save: {path or '<root>'} ({mod.name}) is not tuned; run kiln.tune.tune first")
    records: list[dict[str, Any]] = []
    weights = None
    if choice is not None and not mod.superseded:  # a superseded wrapper's compiled form is never called
        records, weights = _artifacts(choice.backend, choice.fn, mod.module, path or "<root>", directory,
                                      f"artifacts/{index}-{_safe(mod.name)}")
    return {
        "name": mod.name,
        "class": f"{type(mod.module).__module__}.{type(mod.module).__qualname__}",
        "structure": structure_digest(mod.module),
        "strategy": mod.strategy.to_json() if mod.strategy is not None else None,
        "backends": [b.to_json() for b in mod.backends] if mod.backends is not None else None,
        "config": choice.config.to_json() if choice is not None and choice.config is not None else None,
        "choice": choice.backend.to_json() if choice is not None else None,
        "source": choice.source if choice is not None else None,
        "superseded": mod.superseded,
        "artifacts": records,
        "weights": weights,
        "report": choice.report.to_json() if choice is not None and choice.report is not None else None,
    }


def _root_entry(model: torch.nn.Module, root: RootChoice, directory: Path) -> dict[str, Any]:
    if root.retune:
        raise ValueError("kiln.tune.save: the model is tuned again at its next call (its saved whole-model choice "
                         "could not be restored); call it once, or run kiln.tune.tune, before saving")
    records: list[dict[str, Any]] = []
    weights = None
    if root.backend is not None:
        records, weights = _artifacts(root.backend, root.fn, model, "the whole model", directory, "artifacts/root")
    return {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "structure": structure_digest(model),
        "config": root.config.to_json() if root.config is not None else None,
        "choice": root.backend.to_json() if root.backend is not None else None,
        "source": root.source,
        "artifacts": records,
        "weights": weights,
        "report": root.report.to_json() if root.report is not None else None,
    }


def save(model: torch.nn.Module, path: str | os.PathLike[str]) -> None:
    """Writes every wrapped module's choice (and AOT artifacts) of ``model`` to the directory ``path``."""
    wrapped = wrapped_modules(model)
    if not wrapped:
        raise ValueError("kiln.tune.save: the model has no wrapped module (kiln.tune.wrap / kiln.tune.Module)")
    target = Path(path)
    if target.exists() and (not target.is_dir() or (any(target.iterdir()) and not (target / MANIFEST).is_file())):
        raise ValueError(f"kiln.tune.save: {target} exists and is not a saved tuning; not overwriting it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    try:
        (tmp / "artifacts").mkdir()
        root = root_choice(model)
        root_entry = _root_entry(model, root, tmp) if root is not None else None
        modules = {p: _entry(i, p, m, tmp) for i, (p, m) in enumerate(wrapped)}
        device = input_device([], model)
        manifest: dict[str, Any] = {"format": FORMAT, "versions": versions(), "device": device_name(device),
                                    "modules": modules}
        if root_entry is not None:
            manifest["root"] = root_entry
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.rename(target, old)
        os.rename(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("kiln.tune.save: %s: %d module(s)", target, len(wrapped))


def _artifact_problem(directory: Path, records: list[dict[str, Any]]) -> str:
    if not records:
        return "its artifact list is empty"
    root = directory.resolve()
    for record in records:
        name = str(record.get("file", ""))
        file = (directory / name).resolve()
        if root not in file.parents:
            return f"artifact {name!r} lies outside the tuning directory"
        if not file.is_file():
            return f"artifact {name} is missing"
        if sha256_file(file) != record.get("sha256"):
            return f"artifact {name} is damaged (SHA-256 mismatch)"
    return ""


def _module_at(model: torch.nn.Module, path: str) -> torch.nn.Module:
    try:
        return model.get_submodule(path) if path else model
    except AttributeError:
        raise ValueError(f"kiln.tune.load: the model has no submodule {path!r}; the tuning was saved for another "
                         "model") from None


def _restore(mod: Module, path: str, entry: dict[str, Any], directory: Path) -> str:
    """Installs the saved choice in ``mod``; returns why it must be re-tuned instead ("" if not)."""
    if entry.get("structure") != structure_digest(mod.module):
        return "its structure differs from the saved one"
    if entry.get("superseded") and entry.get("choice") is None:  # superseded before it was ever called
        mod.set_choice(None)
        mod.supersede("")
        return ""
    try:
        backend = backend_from_json(entry["choice"])
    except (ValueError, TypeError, KeyError) as err:
        return f"its saved backend cannot be rebuilt ({err})"
    report = ModuleReport.from_json(entry["report"]) if entry.get("report") else None
    if report is not None:
        report.source = "file"
    config = mod.config if mod.config is not None else (
        TuneConfig.from_json(entry["config"]) if entry.get("config") else None)
    if entry.get("superseded"):
        mod.set_choice(Choice(backend, None, report, "file", config))
        mod.supersede(report.superseded if report is not None else "by the whole-model choice")
        return ""
    fn = None
    if backend.saves_artifacts:
        records = list(entry.get("artifacts") or [])
        problem = _artifact_problem(directory, records)
        if problem:
            return problem
        if entry.get("weights") != weights_digest(mod.module):
            log.warning("kiln.tune.load: %s: the module's weights differ from those its saved %s program holds; "
                        "compiling it again at its first call", path or "<root>", backend.name)
        else:
            try:
                fn = backend.load_artifacts(mod.module, directory, records)
            except Exception as err:  # noqa: BLE001 - an artifact Kiln refuses is re-tuned, not fatal
                return _unloadable(err)
    mod.set_choice(Choice(backend, fn, report, "file", config))
    return ""


def _unloadable(err: Exception) -> str:
    return f"its artifact cannot be loaded ({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]})"


def _restore_root(model: torch.nn.Module, entry: dict[str, Any], directory: Path, config: TuneConfig | None) -> str:
    """Installs the saved whole-model choice on ``model``; returns why the model must be re-tuned ("" if not)."""
    if entry.get("structure") != structure_digest(model):
        return "the model's structure differs from the saved one"
    backend = None
    if entry.get("choice") is not None:
        try:
            backend = backend_from_json(entry["choice"])
        except (ValueError, TypeError, KeyError) as err:
            return f"the whole model's saved backend cannot be rebuilt ({err})"
    report = ModuleReport.from_json(entry["report"]) if entry.get("report") else None
    if report is not None:
        report.source = "file"
    if config is None and entry.get("config"):
        config = TuneConfig.from_json(entry["config"])
    root = RootChoice(model, backend, None, report, "file", config)
    if backend is not None and backend.saves_artifacts:
        records = list(entry.get("artifacts") or [])
        problem = _artifact_problem(directory, records)
        if problem:
            return problem
        if entry.get("weights") != weights_digest(model):
            log.warning("kiln.tune.load: the model's weights differ from those its saved %s program holds; compiling "
                        "it again at its first call", backend.name)
        else:
            try:
                root.fn = backend.load_artifacts(root.runner, directory, records)
            except Exception as err:  # noqa: BLE001 - an artifact Kiln refuses is re-tuned, not fatal
                return _unloadable(err)
    install_root(model, root)
    return ""


def _retune_whole(model: torch.nn.Module, saved_root: dict[str, Any], problem: str, directory: Path, data: Any,
                  config: TuneConfig | None) -> None:
    """The saved whole-model choice cannot be restored: the model is tuned again, on ``data`` or at its first call."""
    log.warning("kiln.tune.load: %s: %s; re-tuning the model", directory, problem)
    clear_root(model)
    for _, mod in wrapped_modules(model):
        mod.set_choice(None)
    if config is None and saved_root.get("config"):
        config = TuneConfig.from_json(saved_root["config"])
    if data is not None:
        tune(model, data, config=config)
    else:
        install_root(model, RootChoice(model, None, None, None, "file", config, retune=True))
        log.warning("kiln.tune.load: the model is tuned at its first call")


def load(model: torch.nn.Module, path: str | os.PathLike[str], data: Any = None, *,
         config: TuneConfig | None = None) -> torch.nn.Module:
    """Restores the tuning saved in ``path`` into ``model`` and returns the model (a new
    ``kiln.tune.Module`` when the saved tuning wraps the root). Nothing is tuned unless an
    artifact is missing or damaged; see the module docstring."""
    directory = Path(path)
    try:
        with open(directory / MANIFEST) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"kiln.tune.load: {directory} holds no saved tuning ({MANIFEST} is missing)") from None
    except ValueError as err:
        raise ValueError(f"kiln.tune.load: {directory / MANIFEST} is not valid JSON: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"kiln.tune.load: {directory / MANIFEST} is not a saved tuning (format "
                         f"{manifest.get('format') if isinstance(manifest, dict) else None!r}, expected {FORMAT!r})")
    here = device_name(input_device([], model))
    if manifest.get("device") != here or manifest.get("versions") != versions():
        log.warning("kiln.tune.load: %s was tuned on %s with %s; here: %s with %s. The saved choices are used; "
                    "tune again for the fastest ones here", directory, manifest.get("device"), manifest.get("versions"),
                    here, versions())
    root = model
    clear_root(root)
    saved_root = manifest.get("root") if isinstance(manifest.get("root"), dict) else None
    lifted = saved_root is not None and saved_root.get("choice") is not None
    problems: dict[str, str] = {}
    for mpath, entry in dict(manifest.get("modules", {})).items():
        target = _module_at(root, mpath)
        if not isinstance(target, Module):
            strategy = strategy_from_spec(entry["strategy"]) if entry.get("strategy") else None
            wrapper = Module(target, name=entry.get("name"), strategy=strategy, backends=entry.get("backends"))
            if mpath:
                parent_path, _, child = mpath.rpartition(".")
                setattr(_module_at(root, parent_path), child, wrapper)
            else:
                root = wrapper
            target = wrapper
        if config is not None:
            target.config = config
        problem = _restore(target, mpath, entry, directory)
        if problem:
            problems[mpath] = problem
            target.set_choice(None)
            if target.config is None and entry.get("config"):
                target.config = TuneConfig.from_json(entry["config"])
    wrapped_modules(root)  # the saved tuning must not nest wrappers in this model
    if saved_root is not None and lifted:
        problem = "; ".join(f"{p}: {why}" for p, why in problems.items())
        problem = problem or _restore_root(root, saved_root, directory, config)
        if problem:
            _retune_whole(root, saved_root, problem, directory, data, config)
            problems = {p: problem for p in manifest.get("modules", {})}
    else:
        for mpath, problem in problems.items():
            log.warning("kiln.tune.load: %s: %s; re-tuning %s", directory, problem, mpath or "<root>")
        retune = list(problems)
        if retune and data is not None:
            first = _module_at(root, retune[0])
            assert isinstance(first, Module)
            tune(root, data, config=config if config is not None else first.config, modules=retune)
        elif retune:
            for mpath in retune:
                mod = _module_at(root, mpath)
                assert isinstance(mod, Module)
                mod.tune_on_call = True
                log.warning("kiln.tune.load: %s is tuned at its first call", mpath or "<root>")
        if saved_root is not None:
            _restore_root(root, saved_root, directory, config)
    log.info("kiln.tune.load: %s: %d module(s) restored, %d re-tuned", directory,
             len(manifest.get("modules", {})) - len(problems), len(problems))
    return root
