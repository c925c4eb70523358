"""The JIT hook: any script's top-level modules tuned at their first calls, without code changes.

Installed by ``python -m kiln.tune.run script.py``, by ``KILN_TUNE=1`` (when ``kiln`` is imported,
or at start-up through the sitecustomize shim of ``python -m kiln.tune.run --site-dir``) or by
``kiln.tune.hook.install(config)``. It replaces ``torch.nn.Module.__call__`` with a function that
passes every call through unchanged except a top-level one: a module called while no other module
call (and no tuning) is running, outside of Dynamo tracing. Such a module, when it is eligible, gets
a ``kiln.tune.Module`` wrapper with ``tune_on_call`` and the hook's config, and its calls go
through the wrapper: the first ``calls_before_tuning`` calls are recorded and the module is tuned
on them (or takes its choice from the tuning cache, on by default here), later calls run the winner.

Not eligible (always called as is): Kiln's and torch's compiled modules, scripted modules, kiln.tune
wrappers, modules with fewer than ``min_params`` parameters and classes filtered out by
``include`` / ``exclude``. A call with gradients needed (grad mode on and a parameter requiring
grad) or of a module in training mode with batch norm or dropout runs eagerly, untuned.

The wrapper is kept in the module's ``__dict__`` in a slot that pickles and copies as an empty
dict, so the module's lifetime, ``torch.save`` and ``copy.deepcopy`` are unaffected.
"""

from __future__ import annotations

import atexit
import fnmatch
import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch

from kiln.tune.config import TuneConfig, load_config
from kiln.tune.fingerprint import device_name, versions
from kiln.tune.module import Module
from kiln.tune.results import TuneReport
from kiln.tune.tuner import JIT_REPORTS, training_sensitive

log = logging.getLogger("kiln.tune")

__all__ = ["install", "uninstall", "installed", "install_from_env", "enabled_by_env"]

_SLOT_KEY = "_kiln_tune_jit"
_TRUE = {"1", "true", "yes", "on"}


class _Slot:
    """Per module: its wrapper (None when not eligible) and cached facts about it."""

    def __init__(self, wrapper: Module | None, needs_grad: bool = False) -> None:
        self.wrapper = wrapper
        self.needs_grad = needs_grad
        self.training: bool | None = None
        self.sensitive = False
        self.said: set[str] = set()

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, ())  # pickled or copied with the module: an empty dict, no kiln.tune needed to load it


class _Busy(threading.local):
    busy = False


class _Hook:
    def __init__(self, config: TuneConfig) -> None:
        self.config = config
        self.names: Counter[str] = Counter()
        self.lock = threading.RLock()

    def _excluded(self, module: torch.nn.Module) -> str:
        from torch._dynamo.eval_frame import OptimizedModule

        from kiln.aot import KilnModule

        if isinstance(module, (Module, OptimizedModule, KilnModule, torch.fx.GraphModule, torch.jit.ScriptModule)):
            return "compiled or wrapped already"
        cls = type(module)
        names = (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")
        if self.config.include and not any(fnmatch.fnmatchcase(n, p) for n in names for p in self.config.include):
            return "not in the config's include list"
        if any(fnmatch.fnmatchcase(n, p) for n in names for p in self.config.exclude):
            return "in the config's exclude list"
        if sum(p.numel() for p in module.parameters()) < self.config.min_params:
            return f"fewer than {self.config.min_params} parameter(s)"
        return ""

    def admit(self, module: torch.nn.Module) -> _Slot:
        reason = self._excluded(module)
        if reason:
            log.debug("kiln.tune: %s is not tuned: %s", type(module).__name__, reason)
            slot = _Slot(None)
        else:
            name = type(module).__name__
            self.names[name] += 1
            label = name if self.names[name] == 1 else f"{name}#{self.names[name]}"
            wrapper = Module(module, name=label, config=self.config, tune_on_call=True)
            slot = _Slot(wrapper, needs_grad=any(p.requires_grad for p in module.parameters()))
        module.__dict__[_SLOT_KEY] = slot
        return slot


_STATE: _Hook | None = None
_ORIGINAL_CALL: Any = None
_INSTALL_LOCK = threading.Lock()
_LOCAL = _Busy()
_REPORT_AT_EXIT = False


def _say_once(slot: _Slot, wrapper: Module, what: str) -> None:
    if what not in slot.said:
        slot.said.add(what)
        log.warning("kiln.tune: %s is called %s; it runs eagerly, untuned, on such calls", wrapper.name, what)


def _call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    original = _ORIGINAL_CALL
    if torch.compiler.is_compiling():  # first: Dynamo traces this frame when it compiles a module's call
        return original(self, *args, **kwargs)
    hook = _STATE
    if hook is None or _LOCAL.busy:
        return original(self, *args, **kwargs)
    slot = self.__dict__.get(_SLOT_KEY)
    if type(slot) is not _Slot:
        with hook.lock:
            slot = hook.admit(self)
    _LOCAL.busy = True  # the modules this call calls are not top-level, whether this one is tuned or not
    try:
        wrapper = slot.wrapper
        if wrapper is None:
            return original(self, *args, **kwargs)
        if slot.needs_grad and torch.is_grad_enabled():
            _say_once(slot, wrapper, "with gradients enabled (use torch.no_grad() or torch.inference_mode())")
            return original(self, *args, **kwargs)
        if slot.training is not self.training:
            slot.training, slot.sensitive = self.training, training_sensitive(self)
        if slot.sensitive:
            _say_once(slot, wrapper, "in training mode with batch norm or dropout (call .eval())")
            return original(self, *args, **kwargs)
        if wrapper._choice is None:
            with hook.lock:
                return original(wrapper, *args, **kwargs)
        return original(wrapper, *args, **kwargs)
    finally:
        _LOCAL.busy = False


def _write_report() -> None:
    state = _STATE
    if state is None or not state.config.report_path:
        return
    device = device_name(torch.device("cuda")) if torch.cuda.is_available() else device_name(torch.device("cpu"))
    try:
        TuneReport(list(JIT_REPORTS), device, versions()).save_json(state.config.report_path)
    except OSError as err:
        log.warning("kiln.tune: could not write the report to %s (%s)", state.config.report_path, err)


def install(config: TuneConfig | None = None) -> None:
    """Installs the hook (again: replaces its config). None reads the config as ``KILN_TUNE_CONFIG`` says."""
    global _STATE, _ORIGINAL_CALL, _REPORT_AT_EXIT
    with _INSTALL_LOCK:
        config = config if config is not None else load_config(jit=True)
        if _STATE is not None:
            _STATE.config = config
        else:
            _ORIGINAL_CALL = torch.nn.Module.__call__
            torch.nn.Module.__call__ = _call  # type: ignore[method-assign]
            _STATE = _Hook(config)
        if config.report_path and not _REPORT_AT_EXIT:
            atexit.register(_write_report)
            _REPORT_AT_EXIT = True
    log.info("kiln.tune: JIT hook installed (strategy %s; backends %s; cache %s)", config.strategy_obj.kind,
             ", ".join(b.name for b in config.backend_list), config.cache_dir if config.cache else "off")


def uninstall() -> None:
    """Restores ``torch.nn.Module.__call__``; modules tuned so far run eagerly from now on."""
    global _STATE
    with _INSTALL_LOCK:
        if _STATE is not None:
            torch.nn.Module.__call__ = _ORIGINAL_CALL  # type: ignore[method-assign]
            _STATE = None


def installed() -> bool:
    return _STATE is not None


def enabled_by_env(env: Mapping[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get("KILN_TUNE", "").strip().lower() in _TRUE


def install_from_env() -> bool:
    """Installs the hook when ``KILN_TUNE`` is 1/true/yes/on; returns whether it is installed. A
    config that cannot be read is logged as an error and the program runs untuned."""
    if enabled_by_env() and not installed():
        try:
            install()
        except (OSError, ValueError, TypeError) as err:
            log.error("kiln.tune: KILN_TUNE=1, but the hook is not installed: %s", err)
    return installed()
