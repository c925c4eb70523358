"""Saved tunings: ``kiln.tune.save(model, path)`` / ``kiln.tune.load(model, path)``.

A saved tuning is a directory::

    <path>/tune.json                  the manifest (format "kiln.tune/1")
    <path>/artifacts/<i>-<name>.<j>.pt2   compiled programs of AOT choices (kiln.save files)

The manifest maps each wrapped module's path in the model ("" for a wrapped root) to its
choice (backend kind, name and config), the strategy and candidates it was tuned with, the tuning
config, its report, a digest of its structure, and for an AOT choice the artifact files with
their SHA-256 and the digest of the weights they hold. ``save`` writes a new directory and swaps
it in, so a reader sees the old tuning or the new one.

``load`` wraps the modules named in the manifest (those not wrapped yet) and restores each choice
without tuning: a JIT choice compiles at the module's first call, an AOT choice loads its
artifacts with ``kiln.load`` (which checks every engine) after checking their SHA-256. A module
whose artifact is missing, damaged or unreadable, or whose structure differs from the saved one,
is re-tuned, with a warning: on ``data`` when given, else at its first call. A module whose weights
differ from those its artifact holds compiles its choice again at its first call.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from kiln.tune.backends import backend_from_json
from kiln.tune.config import TuneConfig
from kiln.tune.fingerprint import device_name, sha256_file, structure_digest, versions, weights_digest
from kiln.tune.inputs import input_device
from kiln.tune.module import Choice, Module
from kiln.tune.results import ModuleReport
from kiln.tune.strategies import strategy_from_spec
from kiln.tune.tuner import tune, wrapped_modules

log = logging.getLogger("kiln.tune")

__all__ = ["save", "load", "MANIFEST", "FORMAT"]

MANIFEST = "tune.json"
FORMAT = "kiln.tune/1"


def _safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]", "_", name)[:64] or "root"


def _entry(index: int, path: str, mod: Module, directory: Path) -> dict[str, Any]:
    choice = mod._choice
    if choice is None:
        raise ValueError(f"kiln.tune.save: {path or '<root>'} ({mod.name}) is not tuned; run kiln.tune.tune first")
    records: list[dict[str, Any]] = []
    weights = None
    if choice.backend.saves_artifacts:
        if choice.fn is None:
            raise ValueError(f"kiln.tune.save: {path or '<root>'}: its {choice.backend.name} program is compiled "
                             "at its next call; call the model once before saving")
        records = choice.backend.save_artifacts(choice.fn, directory, f"artifacts/{index}-{_safe(mod.name)}")
        for record in records:
            record["sha256"] = sha256_file(directory / record["file"])
        weights = weights_digest(mod.module)
    return {
        "name": mod.name,
        "class": f"{type(mod.module).__module__}.{type(mod.module).__qualname__}",
        "structure": structure_digest(mod.module),
        "strategy": mod.strategy.to_json() if mod.strategy is not None else None,
        "backends": [b.to_json() for b in mod.backends] if mod.backends is not None else None,
        "config": choice.config.to_json() if choice.config is not None else None,
        "choice": choice.backend.to_json(),
        "source": choice.source,
        "artifacts": records,
        "weights": weights,
        "report": choice.report.to_json() if choice.report is not None else None,
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
        modules = {p: _entry(i, p, m, tmp) for i, (p, m) in enumerate(wrapped)}
        device = input_device([], model)
        manifest = {"format": FORMAT, "versions": versions(), "device": device_name(device), "modules": modules}
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
    try:
        backend = backend_from_json(entry["choice"])
    except (ValueError, TypeError, KeyError) as err:
        return f"its saved backend cannot be rebuilt ({err})"
    report = ModuleReport.from_json(entry["report"]) if entry.get("report") else None
    if report is not None:
        report.source = "file"
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
                return f"its artifact cannot be loaded ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
    config = mod.config if mod.config is not None else (
        TuneConfig.from_json(entry["config"]) if entry.get("config") else None)
    mod.set_choice(Choice(backend, fn, report, "file", config))
    return ""


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
    retune: list[str] = []
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
            log.warning("kiln.tune.load: %s: %s; re-tuning %s", directory, problem, mpath or "<root>")
            target.set_choice(None)
            if target.config is None and entry.get("config"):
                target.config = TuneConfig.from_json(entry["config"])
            retune.append(mpath)
    wrapped_modules(root)  # the saved tuning must not nest wrappers in this model
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
    log.info("kiln.tune.load: %s: %d module(s) restored, %d re-tuned", directory,
             len(manifest.get("modules", {})) - len(retune), len(retune))
    return root
