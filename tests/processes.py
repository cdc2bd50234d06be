"""Processes the tests start and look for: the real CLI in a subprocess, and leftovers in /proc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from cluster_accept.inventory.threshold_needs import GPU_DATASHEET_FLOORS, NEEDS_CUDA
from tests.prefect_server import session_api

ROOT = Path(__file__).resolve().parent.parent


def cli_env(ephemeral: bool = False) -> dict[str, str] | None:
    """A CLI run's environment: this one, pointed at the session's Prefect server
    (:func:`tests.prefect_server.session_api`) unless the test set ``PREFECT_API_URL`` itself or asks for
    Prefect's ephemeral mode (``ephemeral``: the controller starts an API server of its own)."""
    if ephemeral or "PREFECT_API_URL" in os.environ:
        return None
    return {**os.environ, "PREFECT_API_URL": session_api()}


def run_cli(*args: str, timeout: float = 240, ephemeral: bool = False) -> subprocess.CompletedProcess[str]:
    """``cluster-accept ARGS`` as a separate process (real Prefect, real exit code), from the repo root."""
    return subprocess.run(
        [sys.executable, "-m", "cluster_accept.flows.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env=cli_env(ephemeral),
    )


def start_cli(*args: str, session: bool = False, ephemeral: bool = False) -> subprocess.Popen[str]:
    """``cluster-accept ARGS`` started in the background (stdout and stderr piped), for tests that act on
    the run while it goes; ``session``: in its own session, so the controller can be killed as one
    (``os.killpg``), like a crashed host."""
    return subprocess.Popen(
        [sys.executable, "-m", "cluster_accept.flows.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=session,
        env=cli_env(ephemeral),
    )


def run_verdicts(out_dir: Path) -> dict[str, tuple[str, list[str]]]:
    """node -> (verdict, reasons) of the one run under ``out_dir``."""
    frame = pd.read_parquet(only_run(out_dir) / "verdicts.parquet")
    return {r.node: (r.verdict, list(r.reasons)) for r in frame.itertuples()}


def processes_matching(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (this test process excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(int(entry.name))
    return found


def only_run(out_dir: Path) -> Path:
    """The one run directory under ``out_dir`` (``history/`` beside it is the history dataset)."""
    runs = [p for p in out_dir.iterdir() if p.is_dir() and p.name != "history"]
    assert len(runs) == 1, f"expected one run directory in {out_dir}, found {sorted(p.name for p in runs)}"
    return runs[0]


def interpreter_stand_in(body: str) -> str:
    """A shell script to put in ``probes.python`` that answers preflight's probe interpreter check (``python -c
    ...``), a free port's pick (``python -I -c ...``) and the settings read before each probe run
    (``job_settings.py``) with this machine's Python, so the node reaches the probes, and runs ``body`` for the
    probes."""
    return f'#!/bin/sh\ncase "$1" in -c|-I|job_settings.py) exec {sys.executable} "$@";; esac\n{body}\n'


def auto_cpu_inventory(inventory: Path, path: Path, **thresholds: Any) -> Path:
    """A test-bed's inventory (at ``inventory``) on ``profile: auto``, written to ``path``: its own keys for what a
    CPU test-bed is (gloo ranks, no GPU figures: every datasheet floor turned off), no rails and nothing expected
    between nodes but what the fabric implies; ``thresholds`` over ``straggler_pct: 90``."""
    data: dict[str, Any] = yaml.safe_load(inventory.read_text())
    profile = next(iter(data["profiles"].values()))
    profile["base"] = "auto"
    profile["probes"].pop("rails")
    profile["probes"]["expected_transport"].pop("inter_node")
    floors = dict.fromkeys(sorted({*NEEDS_CUDA, *GPU_DATASHEET_FLOORS}))  # none measured by gloo on CPU
    profile["thresholds"] = {"straggler_pct": 90, **thresholds, **floors}
    path.write_text(yaml.safe_dump(data))
    return path
