"""``kiln.tune``: pick the fastest correct backend per module, ahead of time or just in time.

    import kiln.tune as kt
    print(kt.inspect(model, data))                     # where the time goes, per submodule
    kt.wrap(model, ["encoder", "head"])                # those submodules, wrapped in place
    report = kt.tune(model, data)                      # every candidate measured, winners installed;
                                                       # and on the whole model: one backend there if faster
    kt.save(model, "model.tune")                       # choices + Kiln AOT programs, SHA-256 checked
    model = kt.load(model, "model.tune")               # in another process: no tuning

    python -m kiln.tune.run script.py                  # JIT: a script's top-level modules tuned
    KILN_TUNE=1 KILN_TUNE_CONFIG=tune.json python ...  # the same through the environment

Candidates are backends (``Eager``, ``KilnJit``, ``KilnAot``, ``Inductor``; a new one is one
subclass of ``Backend``), compared with eager on the tuning data and rejected with a reason when
wrong, failing or slower than eager; a strategy (``OneBackend``, ``FirstThatWorks``,
``MinLatency``, ``MaxThroughput``, ``LatencyBudget``) chooses among the rest. Every candidate is
also timed on the whole model; one that beats the wrappers' choices together runs the whole model
instead (``root_choice``). docs/tune.md is the reference.
"""

from __future__ import annotations

import torch

from kiln.tune.backends import Backend, Eager, Inductor, KilnAot, KilnJit, backend_from_spec, registered_kinds
from kiln.tune.config import DEFAULT_TOLERANCES, TuneConfig, default_backends, load_config
from kiln.tune.fingerprint import device_name, versions
from kiln.tune.hook import install_from_env as _install_from_env
from kiln.tune.inputs import Inputs, input_device
from kiln.tune.module import Module
from kiln.tune.results import COMPOSED, CandidateResult, ModuleReport, TuneReport
from kiln.tune.root import RootChoice, root_choice
from kiln.tune.storage import load, save
from kiln.tune.strategies import (
    FirstThatWorks,
    LatencyBudget,
    MaxThroughput,
    MinLatency,
    OneBackend,
    Strategy,
    strategy_from_spec,
)
from kiln.tune.survey import Inspection, ModuleStats, inspect, wrap
from kiln.tune.tuner import tune, wrapped_modules

__all__ = [
    "Backend", "Eager", "KilnJit", "KilnAot", "Inductor", "backend_from_spec", "registered_kinds",
    "Strategy", "OneBackend", "FirstThatWorks", "MinLatency", "MaxThroughput", "LatencyBudget", "strategy_from_spec",
    "TuneConfig", "load_config", "default_backends", "DEFAULT_TOLERANCES",
    "Module", "Inputs", "inspect", "Inspection", "ModuleStats", "wrap", "tune", "wrapped_modules", "save", "load",
    "TuneReport", "ModuleReport", "CandidateResult", "report", "RootChoice", "root_choice", "COMPOSED",
]


def report(model: torch.nn.Module) -> TuneReport:
    """The reports of every tuned wrapped module of ``model`` and its whole-model comparison, in one TuneReport."""
    reports = [m.report for _, m in wrapped_modules(model) if m.report is not None]
    root = root_choice(model)
    return TuneReport(reports, device_name(input_device([], model)), versions(),
                      root.report if root is not None else None)


_install_from_env()
