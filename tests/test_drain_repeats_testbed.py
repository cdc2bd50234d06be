"""A relative finding drains a node only once it repeats, on the test-bed with a real Slurm (Debian's munged,
slurmctld and a slurmd in every simulated node): a node ten times slower than its peers (the test-bed fault
``slower``: every ``torch.matmul`` on it takes 10x as long, so its GEMM figures are a tenth of its peers') is held
in runs 1 and 2 and drained by run 3; a node with a GPU missing is drained by run 1. Ten times, not the 1.3 of
``tests/test_noise_testbed.py``: a straggler is confirmed by measuring it again beside a control node, its figure
divided by the control's own drift since, and while this machine's other work slows the control down to a third
(seen while other test suites ran), a node three times slower is cleared; ten times slower stays a straggler.

Six nodes: the drain breaker's default (``max(1, 10 % of 6)``: one drain a run) stays in force, so each run drains
one node at most (the held drain is not counted), and a run told to drain both at once (``--fail-streak 1``, no
drain held) is refused by the breaker, nothing drained, exit 3; that run writes to an ``--out`` of its own, so it
is no run of the nodes' in the count of the three. Five of them are measured (the one without its GPU stops at
preflight): four healthy peers keep the median and the peers' spread where they are when this machine's other
work slows one of them down while it is probed (with three, one such peer makes the spread so wide that the
noise-aware judgement calls the slow node inconclusive, rightly, and the test would fail on the machine).

The three runs are ``cluster-accept run``, one after the other into one ``--out``, not runs of a served
deployment: a held drain's count reads the node's runs under ``--out`` (``OUT/<run_id>/verdicts.parquet``) in the
end of a run that ``run`` and ``serve`` share (``flows.finish`` -> ``ops.after_run``), and a deployment carrying
``--fail-streak/--fail-share/--fail-window`` is tested in ``tests/test_drain_repeats.py``; serving would add a
Prefect server and three triggered runs to a test that already takes four runs on this machine's two cores.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from cluster_accept.testbed import bed as testbed
from tests.processes import only_run, run_cli
from tests.test_slurm_testbed import drains

pytestmark = [pytest.mark.testbed, pytest.mark.soak]  # docs/development.md: the soak tier

PREFIX, SUBNET = "csr", "10.254.188.0/24"
SLOW, NO_GPU = "node03", "node06"
FAULTS = {"nodes": {SLOW: [{"slower": {"factor": 10.0}}], NO_GPU: ["gpu_missing"]}}
NODES = [f"node0{i}" for i in range(1, 7)]


def failing_inventory(bed: testbed.Testbed, path: Path) -> Path:
    """The test-bed's inventory with relative findings failing: a figure 30 % below its peers' median rejects the
    node (the test-bed's own profile only warns, and only at 90 %). A tenth of its peers' figure is far past it;
    the healthy nodes' own spread on this machine is well within it."""
    data = yaml.safe_load(bed.inventory_path.read_text())
    for profile in data["profiles"].values():
        profile["thresholds"].update({"straggler_pct": 30, "relative_verdict": "fail"})
    path.write_text(yaml.safe_dump(data))
    return path


def record(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "slurm.json").read_text()))


def verdicts(run_dir: Path) -> dict[str, tuple[str, list[str]]]:
    rows = pd.read_parquet(run_dir / "verdicts.parquet").to_dict("records")
    return {str(r["node"]): (str(r["verdict"]), [str(x) for x in r["reasons"]]) for r in rows}


def held_line(said: str, node: str) -> str:
    """The CLI's line for ``node``'s held drain (empty when none)."""
    found = re.search(rf"^slurm: {node} held: .*$", said, re.MULTILINE)
    return found.group(0) if found else ""


def check_straggler_only(run_dir: Path) -> None:
    """The slow node was rejected for its GEMM figures against its peers, nothing hard; the other node for its
    missing GPU."""
    judged = verdicts(run_dir)
    verdict, reasons = judged[SLOW]
    assert verdict == "rejected" and "gemm:straggler" in reasons, judged
    assert all(r.split(":")[1] in {"straggler", "straggler_unconfirmed"} for r in reasons), judged
    assert judged[NO_GPU][0] == "rejected" and "gpu_count:count_low" in judged[NO_GPU][1], judged


# A run probes five nodes one after the other, the slow one ten times as long, and measures the straggler again
# in paired rounds: on a 2-core machine running other tests beside it, past the CLI's default 240 s.
RUN_TIMEOUT_S = 600


def run_args(inventory: Path, out: Path) -> list[str]:
    """``cluster-accept run --drain --apply`` of preflight and single-node (no history: each run judged on its
    own figures), with the breaker's default limit."""
    stages = ["--stages", "preflight,single-node", "--history", "-"]
    return ["run", "--inventory", str(inventory), "--out", str(out), *stages, "--drain", "--apply"]


@pytest.fixture
def bed(testbed_factory, monkeypatch: pytest.MonkeyPatch) -> testbed.Testbed:  # type: ignore[no-untyped-def]
    tb: testbed.Testbed = testbed_factory(nodes=6, faults=FAULTS, prefix=PREFIX, subnet=SUBNET, slurm=True)
    for key, value in tb.slurm_env.items():
        monkeypatch.setenv(key, value)
    for node, (drained, _) in drains().items():  # the other test's drains, on the same test-bed
        if drained:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=True, timeout=60)
    return tb


@pytest.fixture
def inventory(bed: testbed.Testbed, tmp_path: Path) -> Path:
    return failing_inventory(bed, tmp_path / "inventory.yaml")


def test_a_slow_node_drains_on_its_third_run_a_missing_gpu_on_its_first(
    bed: testbed.Testbed, inventory: Path, tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    untouched = drains()
    assert not any(drained for drained, _ in untouched.values()), untouched
    for count in (1, 2):
        proc = run_cli(*run_args(inventory, out), timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        run_dir = max(p for p in out.iterdir() if p.is_dir())
        check_straggler_only(run_dir)
        line = held_line(proc.stdout, SLOW)
        assert "gemm:straggler" in line, proc.stdout
        assert line.endswith(f" {count} of 3 consecutive runs ({count} of 3 in its last 6 runs)"), line
        said = record(run_dir)
        assert said["breaker"] is None and said["repeats_unread"] == []
        held = [(h["node"], h["streak"], h["failed_in_window"], h["said"]) for h in said["held_until_repeated"]]
        assert (SLOW, count, count, line.removeprefix("slurm: ")) in held, held
        in_slurm = drains()
        assert in_slurm[SLOW] == untouched[SLOW]  # held: not drained
        assert in_slurm[NO_GPU][0], in_slurm  # a GPU missing: drained by the first run, left drained after
        first = min(p for p in out.iterdir() if p.is_dir()).name
        assert re.fullmatch(rf"cluster-accept: gpu_count:count_low.* \(run {first}\)", in_slurm[NO_GPU][1]), in_slurm
        drained_now = [a["node"] for a in said["actions"] if a["action"] == "drain" and a["applied"]]
        assert drained_now == ([NO_GPU] if count == 1 else []), said["actions"]

    third = run_cli(*run_args(inventory, out), timeout=RUN_TIMEOUT_S)
    assert third.returncode == 1, third.stdout + third.stderr
    run_dir = max(p for p in out.iterdir() if p.is_dir())
    check_straggler_only(run_dir)
    assert held_line(third.stdout, SLOW) == "", third.stdout
    said = record(run_dir)
    assert said["breaker"] is None and SLOW not in [h["node"] for h in said["held_until_repeated"]]
    assert [(a["node"], a["action"], a["applied"]) for a in said["actions"]] == [(SLOW, "drain", True)]
    in_slurm = drains()
    assert in_slurm[SLOW] == (True, f"cluster-accept: gemm:straggler (run {run_dir.name})"), in_slurm
    assert {n: d for n, d in in_slurm.items() if n not in (SLOW, NO_GPU)} == {
        n: d for n, d in untouched.items() if n not in (SLOW, NO_GPU)
    }
    reasons = subprocess.run(["sinfo", "-R", "-h", "-o", "%N|%E"], capture_output=True, text=True, check=True)
    assert f"{SLOW}|cluster-accept: gemm:straggler (run {run_dir.name})" in reasons.stdout.splitlines()
    assert len([p for p in out.iterdir() if p.is_dir()]) == 3 and set(verdicts(run_dir)) == set(NODES)


def test_breaker_still_applies_when_nothing_is_held(bed: testbed.Testbed, inventory: Path, tmp_path: Path) -> None:
    """``--fail-streak 1``: the slow node is due on its first run, as every rejected node was before drains were
    held; with the missing GPU's that is two drains of six nodes, past the breaker's one: nothing drained."""
    untouched = drains()
    once = run_cli(*run_args(inventory, tmp_path / "once"), "--fail-streak", "1", timeout=RUN_TIMEOUT_S)
    assert once.returncode == 3, once.stdout + once.stderr
    assert "of 6 tested nodes would be drained, more than the breaker allows" in once.stderr, once.stderr
    assert f"slurm: not drained: {SLOW}: cluster-accept: gemm:straggler" in once.stdout, once.stdout
    assert f"slurm: not drained: {NO_GPU}: cluster-accept: gpu_count:count_low" in once.stdout, once.stdout
    assert held_line(once.stdout, SLOW) == ""
    said = record(only_run(tmp_path / "once"))
    assert said["actions"] == [] and said["held_until_repeated"] == []
    assert {SLOW, NO_GPU} <= {h["node"] for h in said["breaker"]["held"]}, said["breaker"]
    assert "(max(1, 0.1 x 6 tested nodes) = 1)" in said["breaker"]["why"]  # the default limit, unchanged
    assert drains() == untouched
