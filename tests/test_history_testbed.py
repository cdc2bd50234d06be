"""A node held to its own history on the test-bed (real sshd, the real CLI, ``profile: auto`` with the default
relative judgement: ``straggler_pct`` 5, ``noise_k`` 3), over one shared history.

Ten healthy runs of four nodes on a quiet machine, then ten more beside a busy loop on this machine's cores (the noise
test's): no node may be rejected in any of them (a figure against its own history passes, is inconclusive, or moved
with the cluster). Then one setting that slows a CPU GEMM here is added to one node's job environment: that node is
rejected with that setting alone as the proved cause, found against its own last accepted run, and no other node is
rejected. The count of inconclusive rows and of rows that moved with the cluster is printed. A run takes about 3
minutes here (its stragglers measured again in paired rounds): ``CA_HISTORY_RUNS`` sets fewer runs of each kind.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.testbed import bed as testbed
from tests.processes import auto_cpu_inventory, only_run, run_cli, run_verdicts
from tests.test_noise_testbed import busy_loop
from tests.test_prove_causes_testbed import slowest_setting_here

pytestmark = [pytest.mark.testbed, pytest.mark.soak]  # docs/development.md: the soak tier
RUNS = int(os.environ.get("CA_HISTORY_RUNS", "10"))  # quiet runs, then as many beside the busy loop
NODES = ("node01", "node02", "node03", "node04")
Factory = Callable[..., testbed.Testbed]


def _run(inventory: Path, out: Path, history: Path, load: AbstractContextManager[object]) -> tuple[pd.DataFrame, dict]:  # type: ignore[type-arg]
    with load:
        proc = run_cli(
            "run", "--inventory", str(inventory), "--out", str(out), "--stages", "preflight,single-node",
            "--history", str(history), timeout=900,
        )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return pd.read_parquet(only_run(out) / "checks.parquet"), run_verdicts(out)


def test_healthy_runs_against_their_history_reject_no_node_and_a_setting_added_later_is_named_alone(
    testbed_factory: Factory, tmp_path: Path
) -> None:
    name, value, dtype, slowdown = slowest_setting_here()
    bed = testbed_factory(nodes=4, prefix="canh", subnet="10.254.184.0/24")
    inventory = auto_cpu_inventory(bed.inventory_path, tmp_path / "inventory.yaml", straggler_pct=5.0)
    history = tmp_path / "history"
    seen: Counter[str] = Counter()
    for turn in range(2 * RUNS):
        load = busy_loop() if turn >= RUNS else nullcontext()
        checks, verdicts = _run(inventory, tmp_path / f"out{turn}", history, load)
        judged = checks[checks["item"].str.endswith("_vs_history")]
        seen.update(judged["reason"])
        rejected = {n: v for n, v in verdicts.items() if v[0] != "accepted"}
        assert not rejected, (turn, rejected, judged[judged.status != "pass"][["node", "item", "reason", "detail"]])
    print(f"rows against history over {2 * RUNS} healthy runs: {dict(seen)}")
    assert seen["ok"] > 0 and seen["regression"] == 0

    testbed.set_fault(bed, "node02", [{"nccl_env": {name: value}}])
    checks, verdicts = _run(inventory, tmp_path / "planted", history, nullcontext())
    assert verdicts["node02"][0] == "rejected", verdicts
    assert all(verdicts[n][0] == "accepted" for n in NODES if n != "node02"), verdicts
    settings = checks[(checks.check == "job_settings")]
    assert set(settings.node) == {"node02"}, settings
    assert list(settings["item"]) == [name] and list(settings.reason) == ["confirmed"], settings
    detail = settings.detail.iloc[0]
    assert "against its last accepted run" in detail, detail
    print(f"planted {name}={value} ({dtype} GEMM {slowdown:.1f}x slower here): {detail}")
