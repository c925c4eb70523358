"""The tuning cache: a module's choice of backend, kept between runs.

An entry's key is a SHA-256 over everything the choice depends on: the module's structure (not
its weight values), the input signatures it was tuned on, the device, the versions of Kiln, torch,
CUDA and Python, the candidates with their configs, the strategy and the acceptance rules. Any of
them changing is a miss, so stale choices are never reused. An entry is one JSON file
``<cache_dir>/<key>.json`` holding the chosen backend and the report of the tuning that chose it;
reading one runs no code. Writes are atomic (a temporary file renamed over the entry); a cache
never fails a run: an unreadable entry is a miss and a failed write a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kiln.tune.backends import Backend
from kiln.tune.config import TuneConfig
from kiln.tune.fingerprint import device_name, structure_digest, versions
from kiln.tune.inputs import Inputs, signature
from kiln.tune.strategies import Strategy

log = logging.getLogger("kiln.tune")

__all__ = ["TuningCache", "tuning_key"]

FORMAT = "kiln.tune.cache/1"


def tuning_key(module: torch.nn.Module, samples: Sequence[Inputs], candidates: Sequence[Backend],
               strategy: Strategy, config: TuneConfig, device: torch.device) -> str:
    payload = {
        "format": FORMAT,
        "structure": structure_digest(module),
        "signatures": sorted({signature(s) for s in samples}),
        "device": device_name(device),
        "versions": versions(),
        "candidates": [b.to_json() for b in candidates],
        "strategy": strategy.to_json(),
        "tolerances": dict(config.tolerances),
        "reject_slower_than_eager": config.reject_slower_than_eager,
        "slower_margin": config.slower_margin,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class TuningCache:
    """Entries under ``directory``, one JSON file per key."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self.path(key)
        try:
            with open(path) as f:
                entry = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("kiln.tune cache: %s is unreadable (%s); tuning again", path, err)
            return None
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
            log.warning("kiln.tune cache: %s is not an entry for its key; tuning again", path)
            return None
        return entry

    def put(self, key: str, choice: dict[str, Any], report: dict[str, Any]) -> None:
        entry = {"format": FORMAT, "key": key, "choice": choice, "report": report}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(entry, f, indent=1)
                os.replace(tmp, self.path(key))
            except BaseException:
                os.unlink(tmp)
                raise
        except (OSError, TypeError, ValueError) as err:
            log.warning("kiln.tune cache: could not store an entry in %s (%s)", self.directory, err)
