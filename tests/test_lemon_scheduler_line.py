"""``history --lemons --format hostlist``: the line a scheduler's exclude takes holds only names that are nodes.
The history is a set of files anyone who can write there can add a row to: a name in it that is no host name (a
hostlist range, a shell command, a space) is named on stderr, never folded into the line and never costing the
other lemons theirs; the command exits 0 with the line."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

import pytest
import yaml

from cluster_accept.analysis.history import append_run
from cluster_accept.analysis.schemas import TABLES, write_table
from tests.processes import run_cli

RUNS = [f"2026110{d}T000000Z-bbbbbb" for d in range(1, 4)]
REAL = ["gpu001", "gpu002"]


def _forged(tmp_path: Path) -> list[str]:
    return ["gpu[001-999]", f"$(touch {tmp_path / 'planted'})", "a b"]


def _history(tmp_path: Path, names: list[str]) -> Path:
    """Three runs in which every one of ``names`` was rejected and ``gpu003`` accepted."""
    history = tmp_path / "history"
    for run in RUNS:
        run_dir = tmp_path / "runs" / run
        run_dir.mkdir(parents=True)
        started = dt.datetime(2026, 11, int(run[7]), tzinfo=dt.timezone.utc)
        write_table(run_dir / "runs.parquet", [{"run_id": run, "cluster": "c", "started": started}], TABLES["runs"])
        verdicts = [(name, "rejected", ["nvlink:inactive"]) for name in names] + [("gpu003", "accepted", [])]
        rows = [
            {"run_id": run, "cluster": "c", "node": node, "profile": "p", "verdict": verdict, "reasons": reasons}
            for node, verdict, reasons in verdicts
        ]
        write_table(run_dir / "verdicts.parquet", rows, TABLES["verdicts"])
        append_run(history, run_dir, run, f"2026-11-0{run[7]}")
    return history


@pytest.mark.integration
def test_forged_history_rows_never_reach_the_schedulers_line(tmp_path: Path) -> None:
    """Exit 0 with the real lemons' line on stdout; each forged name on stderr, none of them in the line, and the
    line run through a shell plants nothing."""
    forged = _forged(tmp_path)
    history = str(_history(tmp_path, [*forged, *REAL]))
    done = run_cli("history", "--history", history, "--lemons", "--format", "hostlist")
    assert (done.returncode, done.stdout) == (0, "gpu[001-002]\n"), done.stderr
    for name in forged:
        assert f"history: lemon {name!r} left out of the hostlist: it is no host name" in done.stderr
    subprocess.run(["sh", "-c", f"echo --exclude={done.stdout.strip()}"], check=True, capture_output=True)
    assert not (tmp_path / "planted").exists()


@pytest.mark.integration
def test_an_inventory_keeps_the_line_to_its_nodes(tmp_path: Path) -> None:
    history = str(_history(tmp_path, [*_forged(tmp_path), *REAL]))
    inventory = tmp_path / "inventory.yaml"
    data = {"cluster": "c", "defaults": {"profile": "p"}, "nodes": [{"hosts": "gpu[001,003]"}], "profiles": {"p": {}}}
    inventory.write_text(yaml.safe_dump(data))
    done = run_cli("history", "--history", history, "--lemons", "--format", "hostlist", "-i", str(inventory))
    assert (done.returncode, done.stdout) == (0, "gpu001\n"), done.stderr
    assert "lemon 'gpu002' left out of the hostlist: it is no node of the inventory" in done.stderr
    refused = run_cli("history", "--history", history, "--lemons", "-i", str(inventory))
    assert refused.returncode == 2 and "--inventory: only with --lemons --format hostlist" in refused.stderr
