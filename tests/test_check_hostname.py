"""The hostname check (a name that does not resolve, or resolves to loopback only), and the node's own
all-reduce meeting on loopback so that such a node still runs it: tried for real in a UTS namespace whose
hostname resolves nowhere (root, so in the test-bed tier)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cluster_accept.checks import hostname
from cluster_accept.checks.base import Status
from cluster_accept.inventory.model import DEFAULT_SSH, LOCAL_ADDRESS, Node, ProbeSettings, Profile
from cluster_accept.probes.scripts import allreduce_command
from cluster_accept.remote.probe_dir import PROBES_DIR
from tests.capture import NO_CLUSTER

PROFILE = Profile()
# What COMMAND printed on a 4 x H200 machine named 'vm' (Debian's /etc/hosts maps it to loopback), on a node
# of a cluster with DNS, and in a namespace whose hostname resolves nowhere.
LOOPBACK = "name=vm\n### addresses\n127.0.0.1\n"
RESOLVED = "name=node01\n### addresses\n10.0.4.17\nfe80::1%eth0\n"
UNRESOLVABLE = "name=ca-no-such-node-x\n### addresses\n"


def judged(text: str) -> list[tuple[Status, str, str | None]]:
    return [(r.status, r.reason, r.observed) for r in hostname.evaluate(hostname.parse(text), PROFILE, NO_CLUSTER)]


def test_each_outcome_has_its_reason() -> None:
    assert judged(RESOLVED) == [(Status.PASS, "ok", "10.0.4.17, fe80::1%eth0")]
    assert judged(LOOPBACK) == [(Status.WARN, "resolves_to_loopback", "127.0.0.1")]
    assert judged(UNRESOLVABLE) == [(Status.FAIL, "unresolvable", "ca-no-such-node-x")]
    assert judged("garbage")[0][:2] == (Status.ERROR, "unparsable_output")


@pytest.mark.testbed
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_a_node_whose_name_resolves_nowhere_is_named_and_still_runs_its_own_all_reduce(tmp_path: Path) -> None:
    def in_namespace(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["unshare", "--uts", "sh", "-c", f"hostname ca-no-such-node-x && {script}"],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "CA_PROBE_DIR": str(tmp_path), "HOME": str(tmp_path)},
        )

    check = in_namespace(hostname.COMMAND)
    assert judged(check.stdout) == [(Status.FAIL, "unresolvable", "ca-no-such-node-x")], check.stderr
    shutil.copy(PROBES_DIR / "allreduce.py", tmp_path / "allreduce.py")
    probes = ProbeSettings(python=shutil.which("python3") or "python3", device="cpu", rendezvous_timeout_s=30)
    node = Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=Profile(probes=probes), address=LOCAL_ADDRESS)
    command = allreduce_command(node)
    assert command is not None
    run = in_namespace(command)
    assert run.returncode == 0, run.stdout[-3000:]
    assert '"metric": "allreduce_busbw_gbps"' in run.stdout
