"""``python -m kiln.tune.run [options] script.py [args...]`` (or ``-m module``): runs a script with
the JIT hook installed, so that its top-level modules are tuned at their first calls.

Options: ``--config FILE`` (default ``$KILN_TUNE_CONFIG``), ``--report FILE`` (the JSON report,
written at exit), ``--quiet`` (no progress bar or table), ``--no-cache`` (tune even when the tuning
cache has a choice). ``--site-dir`` prints the folder of the start-up shim instead: with it on
``PYTHONPATH``, ``KILN_TUNE=1`` installs the hook in any Python process as soon as it imports torch.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Sequence

__all__ = ["main", "site_dir"]


def site_dir() -> str:
    """The folder holding the sitecustomize shim that reads KILN_TUNE at start-up."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.tune.run",
                                     description="Run a Python script with kiln.tune's JIT hook installed.")
    parser.add_argument("--config", help="tuning config file (JSON, or TOML on Python 3.11+)")
    parser.add_argument("--report", help="write the JSON tuning report here at exit")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no table on stderr")
    parser.add_argument("--no-cache", action="store_true", help="do not use the tuning cache")
    parser.add_argument("--site-dir", action="store_true", help="print the start-up shim's folder and exit")
    parser.add_argument("-m", dest="module", help="run a module as a script (like python -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script and its arguments")
    opts = parser.parse_args(argv)
    if opts.site_dir:
        print(site_dir())
        return 0
    if not opts.module and not opts.args:
        parser.error("name a script (or -m module) to run")

    from kiln.tune.config import load_config
    from kiln.tune.hook import install

    config = load_config(opts.config, jit=True)
    changes: dict[str, object] = {}
    if opts.report:
        changes["report_path"] = opts.report
    if opts.quiet:
        changes["progress"] = changes["report"] = False
    if opts.no_cache:
        changes["cache"] = False
    install(config.replace(**changes) if changes else config)

    if opts.module:
        sys.argv = [opts.module, *opts.args]
        runpy.run_module(opts.module, run_name="__main__", alter_sys=True)
    else:
        script, *rest = opts.args
        sys.argv = [script, *rest]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
