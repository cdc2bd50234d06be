"""A ``run.json`` edited by hand into a value a resume cannot use is a usage error (exit 2) naming the key, found
before Prefect starts, not a traceback from inside the flow (exit 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster_accept.flows.run_request import RunRequest, check_request
from cluster_accept.inventory.load import load_inventory
from cluster_accept.ops.after_run import Operations
from cluster_accept.rundir.outputs import ResumeError
from cluster_accept.rundir.run import recorded_options
from cluster_accept.rundir.run_record import RunRecord
from tests.processes import run_cli


def interrupted(tmp_path: Path, **edits: Any) -> Path:
    """``OUT`` holding run ``r1`` as a killed controller leaves it (every key a run writes), with ``edits``."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: here, address: local}]\nprofiles: {p: {}}\n"
    )
    out = tmp_path / "out"
    (out / "r1").mkdir(parents=True)
    info: dict[str, Any] = {
        "run_id": "r1",
        "cluster": "c",
        "inventory": str(inventory),
        "inventory_digest": load_inventory(inventory).digest,
        "stages": ["preflight"],
        "suite": None,
        "nodes_tested": ["here"],
        "nodes_excluded": [],
        "controller": "ctl",
        "quick_probes": False,
        "local": False,
        "simulated": False,
        "options": recorded_options(None, Operations(drain=True), 8),
        "started": "2026-01-01T00:00:00+00:00",
        "ended": None,
        "tools": {"cluster-accept": "0"},
        "resumed": ["2026-01-01T01:00:00+00:00"],
        "stage_seconds": {"preflight": 1.5},
    }
    for key, value in edits.items():
        if "." in key:
            outer, inner = key.split(".", 1)
            info[outer] = {**info[outer], inner: value}
        else:
            info[key] = value
    (out / "r1" / "run.json").write_text(json.dumps(info))
    return out


def test_an_unedited_run_json_resumes(tmp_path: Path) -> None:
    check_request(RunRequest(None, interrupted(tmp_path), resume="r1"))


def test_a_run_json_reads_into_its_record_and_is_written_back_as_it_was(tmp_path: Path) -> None:
    """The typed record a run holds writes ``run.json`` back in the file's own format: every key the file held, as
    it held it, and no key it lacked (an older run, without options, timings or resumes, stays without them)."""
    data = json.loads((interrupted(tmp_path) / "r1" / "run.json").read_text())
    record = RunRecord.model_validate(data)
    assert record.options is not None and record.options.operations.drain and record.options.concurrency == 8
    assert record.saved() == data
    later = ("options", "resumed", "stage_seconds", "quick_probes", "local", "simulated")
    older = {key: value for key, value in data.items() if key not in later}
    assert RunRecord.model_validate(older).saved() == older
    record.resumed.append("2026-01-01T02:00:00+00:00")  # what the run changes in place is written too
    assert record.saved()["resumed"][-1] == "2026-01-01T02:00:00+00:00"


EDITED = {
    "a drain share above 1": (
        {"options.operations": {"drain": True, "max_drain_fraction": 5}},
        "options.operations.max_drain_fraction: Input should be less than or equal to 1",
    ),
    "an unknown option": ({"options.operations": {"drian": True}}, "options.operations.drian: Extra inputs are not"),
    "concurrency as text": ({"options.concurrency": "many"}, "options.concurrency: Input should be a valid integer"),
    "no concurrency": ({"options.concurrency": 0}, "options.concurrency: Input should be greater than or equal to 1"),
    "an unknown stage": ({"stages": ["preflight", "warmup"]}, "stages: Value error, 'warmup' is no stage"),
    "stages as text": ({"stages": "preflight"}, "stages: Input should be a valid list"),
    "a yes/no as text": ({"quick_probes": "no"}, "quick_probes: Input should be a valid boolean"),
    "resumed as text": ({"resumed": "yesterday"}, "resumed: Input should be a valid list"),
    "timings as text": ({"stage_seconds": "fast"}, "stage_seconds: Input should be a valid dictionary"),
}


@pytest.mark.parametrize("case", sorted(EDITED))
def test_an_edited_run_json_is_refused_naming_the_key(tmp_path: Path, case: str) -> None:
    edits, said = EDITED[case]
    out = interrupted(tmp_path, **edits)
    with pytest.raises(ResumeError) as refused:
        check_request(RunRequest(None, out, resume="r1"))
    assert str(refused.value).startswith(f"cannot resume r1: {out / 'r1' / 'run.json'} (edited by hand?): {said}")


@pytest.mark.integration
def test_resuming_an_edited_run_json_exits_2_naming_the_key(tmp_path: Path) -> None:
    out = interrupted(tmp_path, **{"options.operations": {"max_drain_fraction": 5}})
    proc = run_cli("run", "--resume", "r1", "--out", str(out), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("stopped ")]
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot resume r1: {out / 'r1' / 'run.json'} (edited")
    assert "options.operations.max_drain_fraction" in lines[0] and "Traceback" not in proc.stderr
