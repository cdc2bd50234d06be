"""Security on the test-bed: secrets never stored, host keys strict by default, private probe directories.

One run of the real CLI (preflight, single-node) over four nodes: node01 carries NCCL secrets in its session
environment and /etc/nccl.conf (and a wrong NCCL_SOCKET_IFNAME, so its nccl_env output is a failing row's
evidence in the report); node04's key is unknown and the inventory does not opt into ``accept-new``; the
probes' python is a stand-in that records the directory it runs in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from cluster_accept.inventory.load import load_inventory
from cluster_accept.remote.fanout import run_node
from cluster_accept.remote.result import NodeStatus, RemoteCommand, UnreachableCause
from tests.processes import interpreter_stand_in, only_run, run_cli

pytestmark = pytest.mark.testbed

SECRETS = {"NCCL_IB_SECRET_TOKEN": "hunter2-token", "NCCL_PASSWORD": "hunter2-pw"}
PLAN = {"nodes": {"node01": [{"nccl_env": {**SECRETS, "NCCL_SOCKET_IFNAME": "eth9"}}]}}
PROBE_DIR = re.compile(r"^/tmp/cluster-accept-probe\.[A-Za-z0-9]{8}$")


def bed_for(testbed_factory: Any) -> Any:
    return testbed_factory(nodes=4, faults=PLAN, prefix="cas9", subnet="10.254.64.0/24")


def inventory_without_opt_in(bed: Any, tmp_path: Path) -> dict[str, Any]:
    """The test-bed's inventory with no ``host_key_policy`` anywhere, node04 checked against an empty known_hosts."""
    inventory = yaml.safe_load(bed.inventory_path.read_text())
    del inventory["defaults"]["ssh"]["host_key_policy"]
    empty = tmp_path / "known_hosts.empty"
    empty.write_text("")
    for entry in inventory["nodes"]:
        if entry["hosts"] == "node04":
            entry["ssh"] = {"known_hosts": str(empty)}
    return inventory


def stored_text(path: Path) -> str:
    """Everything a file holds as text: every cell of a Parquet file (and its schema metadata), other files decoded."""
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        return f"{table.schema.metadata!r}\n{table.to_pylist()!r}"
    return path.read_bytes().decode("utf-8", "replace")


def test_secrets_host_keys_and_probe_directories_in_one_run(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = bed_for(testbed_factory)
    records = tmp_path / "probe-dirs"
    records.mkdir()
    recorder = tmp_path / "record-probe-dir"
    record = f'f=$(mktemp {records}/dir.XXXXXXXX)\n{{ pwd; stat -c %a .; ls; }} > "$f"'
    recorder.write_text(interpreter_stand_in(record))
    recorder.chmod(0o755)
    inventory = inventory_without_opt_in(bed, tmp_path)
    next(iter(inventory["profiles"].values()))["probes"]["python"] = str(recorder)
    inv_path = tmp_path / "inventory.yaml"
    inv_path.write_text(yaml.safe_dump(inventory))
    out = tmp_path / "runs"

    proc = run_cli("run", "--inventory", str(inv_path), "--out", str(out), "--stages", "preflight,single-node")

    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = only_run(out)
    verdicts = {
        r.node: (r.verdict, list(r.reasons)) for r in pd.read_parquet(run_dir / "verdicts.parquet").itertuples()
    }
    assert verdicts["node01"][0] == "rejected" and "nccl_env:value_mismatch" in verdicts["node01"][1]
    assert verdicts["node04"] == ("unreachable", ["ssh:host-key"])  # strict without being asked for

    # (a) Not one copy of a secret in the run directory, the history, or what the CLI printed.
    files = [p for d in (run_dir, out / "history") for p in sorted(d.rglob("*")) if p.is_file()]
    assert {"checks.parquet", "node_values.parquet", "verdicts.parquet", "run.json", "report.html", "report.md"} <= {
        p.name for p in files
    }
    assert any(p.suffix == ".parquet" for p in (out / "history").rglob("*"))
    for path in files:
        assert "hunter2" not in stored_text(path), path
    assert "hunter2" not in proc.stdout + proc.stderr
    # ... while the names are there, so the operator sees that a value was set.
    checks = pd.read_parquet(run_dir / "checks.parquet")
    raw = checks[(checks.node == "node01") & (checks.check == "nccl_env")].raw_output
    assert raw.str.contains("NCCL_IB_SECRET_TOKEN=\\*\\*\\*\\*").all() and raw.str.contains("NCCL_PASSWORD=").all()
    values = pd.read_parquet(run_dir / "node_values.parquet")
    mine = values[(values.node == "node01") & (values.check == "nccl_env")].set_index("key").value
    assert (mine["NCCL_IB_SECRET_TOKEN"], mine["NCCL_PASSWORD"]) == ("****", "****")
    assert "NCCL_IB_SECRET_TOKEN=****" in (run_dir / "report.html").read_text()

    # (d) Probes ran in a private mktemp -d directory per node, gone after the stage.
    seen = [path.read_text().splitlines() for path in sorted(records.iterdir())]
    # gpu_bench and the all-reduce on node01-03 (the stand-in hands every `python -c` — preflight's interpreter
    # check, the loopback port — to this machine's Python): node01's wrong NCCL_SOCKET_IFNAME is its job
    # environment's finding, so its hardware is still measured.
    assert len(seen) == 6, seen
    dirs = {lines[0] for lines in seen}
    assert len(dirs) == 3 and all(PROBE_DIR.match(d) for d in dirs), dirs
    assert all(lines[1] == "700" and {"allreduce.py", "gpu_bench.py"} <= set(lines[2:]) for lines in seen), seen
    assert not any(Path(d).exists() for d in dirs)


def test_unknown_host_key_is_refused_when_the_inventory_does_not_opt_in(  # type: ignore[no-untyped-def]
    testbed_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bed = bed_for(testbed_factory)
    inventory = inventory_without_opt_in(bed, tmp_path)
    empty = tmp_path / "known_hosts.empty"
    inventory["defaults"]["ssh"]["known_hosts"] = str(empty)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inventory))
    node = load_inventory(path).node("node02")
    assert node.ssh.host_key_policy == "strict"
    result = run_node(node, [RemoteCommand("x", "true")])
    assert (result.status, result.cause) == (NodeStatus.UNREACHABLE, UnreachableCause.HOST_KEY)
    assert "unknown host key" in result.detail
    assert empty.read_text() == ""  # nothing learned

    # No known_hosts in the inventory: the user's own (none here) is all there is, and the key is still refused.
    monkeypatch.setenv("HOME", str(tmp_path))
    del inventory["defaults"]["ssh"]["known_hosts"]
    path.write_text(yaml.safe_dump(inventory))
    node = load_inventory(path).node("node02")
    assert node.ssh.known_hosts is None
    result = run_node(node, [RemoteCommand("x", "true")])
    assert (result.status, result.cause) == (NodeStatus.UNREACHABLE, UnreachableCause.HOST_KEY)
    assert not (tmp_path / ".ssh" / "known_hosts").exists()
