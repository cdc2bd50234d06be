"""The test-bed itself, through the real OpenSSH client: what each simulated node serves, and a clean down.

One 6-node test-bed with faults serves most tests (bring-up takes well under a second); ``down`` is
checked on test-beds of their own so the shared one is not disturbed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster_accept.inventory.load import load_inventory
from cluster_accept.testbed import bed
from cluster_accept.testbed.captures import raw_capture
from cluster_accept.testbed.faults import FaultPlan

pytestmark = pytest.mark.testbed

PREFIX, SUBNET = "catb", "10.254.32.0/24"
HOSTILE = "INIT,ENV  \"quoted\" 'single' back\\slash $HOME"
PLAN = {
    "nodes": {
        "node02": [
            "gpu_missing",
            {"persistence_disabled": {"gpu": 1}},
            {"xid": {"code": 79, "gpu": 2, "at_s": 1234.56789}},  # its stamp: seconds since boot, as dmesg prints it
        ],
        "node03": ["down"],
        "node04": ["host_key_changed"],
        "node05": ["auth_refused"],
        "node06": [
            "nvidia_smi_fail",
            {"driver_version": {"version": "570.86.15"}},
            {"nccl_env": {"NCCL_DEBUG_SUBSYS": HOSTILE, "NCCL_NVLS_ENABLE": None}},
            {"slow": {"rate_mbit": 40}},
        ],
    }
}
FAILED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


@pytest.fixture
def tb(testbed_factory: Callable[..., bed.Testbed]) -> bed.Testbed:
    return testbed_factory(nodes=6, faults=PLAN, prefix=PREFIX, subnet=SUBNET)


def ssh(tb: bed.Testbed, node: str, command: str, timeout_s: float = 5) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        tb.ssh_argv(node, command, connect_timeout_s=timeout_s),
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def sections(output: str) -> list[str]:
    """Outputs of several commands run as ``a; echo @@; b; ...``."""
    return output.split("@@\n")


def test_inventory_and_state(tb: bed.Testbed) -> None:
    inventory = load_inventory(tb.inventory_path)
    assert [n.name for n in inventory.nodes] == [f"node0{i}" for i in range(1, 7)]
    assert [n.address for n in inventory.nodes] == [f"10.254.32.{i}" for i in range(2, 8)]
    assert tb.nodes == {n.name: n.address for n in inventory.nodes}
    node = inventory.node("node03")
    assert node.labels == {"rack": "r01"} and node.profile_name == "testbed-h200x4"
    assert node.ssh.identity_file == str(tb.identity_file) and node.ssh.host_key_policy == "strict"
    profile = node.profile
    assert (profile.gpu.model, profile.gpu.count) == ("NVIDIA H200", 4)  # type: ignore[union-attr]
    assert (profile.driver_version, profile.cuda_version, profile.persistence_mode) == ("580.159.04", "13.0", "enabled")
    assert profile.nvlink is not None and (profile.nvlink.links_per_gpu, profile.nvlink.link_speed_gbps) == (18, 26.562)
    assert profile.nccl_env == {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}
    state = json.loads((tb.state_dir / "state.json").read_text())
    assert state["prefix"] == PREFIX and state["nodes"]["node06"]["veth"] == "catbv6"
    assert state["faults"] == FaultPlan.model_validate(PLAN).as_yaml()
    again = bed.load(tb.state_dir, PREFIX)
    assert (again.nodes, again.faults, again.index) == (tb.nodes, tb.faults, tb.index)


def test_healthy_node(tb: bed.Testbed) -> None:
    proc = ssh(tb, "node01", "nvidia-smi -L; echo @@; cat /proc/driver/nvidia/version; echo @@; "
               "nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader; echo @@; cat /etc/nccl.conf; "
               "echo @@; env; echo @@; command -v nvidia-smi; dmesg | grep -c Xid")  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # grep -c finds no Xid line
    gpus, version, persistence, nccl_conf, env, where = sections(proc.stdout)
    assert gpus == raw_capture("h200x4", "nvidia-smi-L.txt")[0]
    assert gpus.count("NVIDIA H200") == 4
    assert version == raw_capture("h200x4", "proc-driver-version.txt")[0]
    assert persistence == "0, Enabled\n1, Enabled\n2, Enabled\n3, Enabled\n"
    assert nccl_conf == "NCCL_SOCKET_IFNAME=eth0\nNCCL_IB_DISABLE=1\nNCCL_NVLS_ENABLE=0\n"
    variables = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    expected = {"CLUSTER_ACCEPT_TESTBED_NODE": "node01", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1",
                "NCCL_NVLS_ENABLE": "0", "NCCL_VERSION": "2.28.3-1", "CUDA_HOME": "/usr/local/cuda"}  # fmt: skip
    assert {k: variables.get(k) for k in expected} == expected
    assert f"{tb.bin_dir('node01')}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in variables["PATH"]
    assert where == f"{tb.bin_dir('node01')}/nvidia-smi\n0\n"


def test_faulty_gpus_and_kernel_log(tb: bed.Testbed) -> None:
    proc = ssh(tb, "node02", "nvidia-smi -L; echo @@; nvidia-smi --query-gpu=index,persistence_mode "
               "--format=csv,noheader; echo @@; dmesg | grep Xid")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    gpus, persistence, xid = sections(proc.stdout)
    assert gpus == "".join(raw_capture("h200x4", "nvidia-smi-L.txt")[0].splitlines(True)[:3])
    assert persistence == "0, Enabled\n1, Disabled\n2, Enabled\n"
    assert xid == "[ 1234.567890] NVRM: Xid (PCI:0000:00:08): 79, pid=0, name=swapper/0, GPU has fallen off the bus.\n"


def test_driver_failure_env_quoting_and_slow_link(tb: bed.Testbed) -> None:
    proc = ssh(tb, "node06", "nvidia-smi -L; echo \"rc=$?\"; echo @@; cat /proc/driver/nvidia/version; echo @@; "
               "printenv NCCL_DEBUG_SUBSYS; echo @@; env | grep -c NCCL_NVLS_ENABLE; cat /etc/nccl.conf")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    smi, version, subsys, conf = sections(proc.stdout)
    assert smi == FAILED + "rc=9\n"
    assert version.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build")
    assert subsys == HOSTILE + "\n"
    assert conf.splitlines() == ["0", "NCCL_SOCKET_IFNAME=eth0", "NCCL_IB_DISABLE=1", f"NCCL_DEBUG_SUBSYS={HOSTILE}"]
    qdisc = subprocess.run(["tc", "qdisc", "show", "dev", "catbv6"], capture_output=True, text=True, check=True)
    assert "tbf" in qdisc.stdout and "rate 40Mbit" in qdisc.stdout


def test_unreachable_nodes(tb: bed.Testbed) -> None:
    down = ssh(tb, "node03", "true")
    assert down.returncode == 255 and "port 22: Connection refused" in down.stderr
    changed = ssh(tb, "node04", "true")
    assert changed.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in changed.stderr
    assert "Host key verification failed." in changed.stderr
    refused = ssh(tb, "node05", "true")
    assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr


def test_runtime_changes_then_restore(tb: bed.Testbed) -> None:
    bed.kill_sshd(tb, "node01")
    assert "Connection refused" in ssh(tb, "node01", "true").stderr
    bed.start_sshd(tb, "node01")
    assert ssh(tb, "node01", "echo $CLUSTER_ACCEPT_TESTBED_NODE").stdout == "node01\n"
    bed.set_rate(tb, "node01", 8)
    show = ["tc", "qdisc", "show", "dev", "catbv1"]
    assert "rate 8Mbit" in subprocess.run(show, capture_output=True, text=True, check=True).stdout
    bed.set_rate(tb, "node01", None)
    assert "tbf" not in subprocess.run(show, capture_output=True, text=True, check=True).stdout
    bed.set_fault(tb, "node05", ["off"])
    try:
        off = ssh(tb, "node05", "true", timeout_s=1)
        assert off.returncode == 255 and "Connection timed out" in off.stderr
    finally:
        bed.set_fault(tb, "node05", ["auth_refused"])
    assert "Permission denied (publickey)" in ssh(tb, "node05", "true").stderr


def _leftovers(prefix: str, state_dir: Path) -> list[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    procs = subprocess.run(["pgrep", "-f", str(state_dir)], capture_output=True, text=True, check=False).stdout
    return (
        [line for line in netns.splitlines() if line.startswith(f"{prefix}-")]
        + [line for line in links.splitlines() if f" {prefix}br0:" in line or f" {prefix}v" in line]
        + procs.split()
        + ([str(state_dir)] if state_dir.exists() else [])
    )


def test_down_removes_everything_and_spares_other_prefixes(tb: bed.Testbed, tmp_path: Path) -> None:
    state_dir = tmp_path / "bed"
    other = bed.up(2, state_dir=state_dir, prefix="catc", subnet="10.254.36.0/24", base="h100x1")
    try:
        found = _leftovers("catc", state_dir)
        sshds = [x for x in found if x.isdigit()]
        # netns, bridge + veths, state dir; one sshd per node (a daemonizing sshd may briefly show as two)
        assert len(found) - len(sshds) == 2 + 3 + 1 and len(sshds) >= 2
        assert ssh(other, "node02", "nvidia-smi -L").stdout == raw_capture("h100x1", "nvidia-smi-L.txt")[0]
        assert "nvlink" not in load_inventory(other.inventory_path).profiles["testbed-h100x1"].model_fields_set
    finally:
        bed.down(state_dir, "catc")
    assert _leftovers("catc", state_dir) == []
    bed.down(state_dir, "catc")  # idempotent
    assert ssh(tb, "node01", "echo $CLUSTER_ACCEPT_TESTBED_NODE").stdout == "node01\n"  # catb untouched

    # Without state.json (a crashed up): found by prefix and command line.
    again = bed.up(2, state_dir=state_dir, prefix="catc", subnet="10.254.36.0/24")
    try:
        (again.state_dir / "state.json").unlink()
    finally:
        bed.down(state_dir, "catc")
    assert _leftovers("catc", state_dir) == []


def test_bad_plans_fail_before_anything_is_created(tb: bed.Testbed, tmp_path: Path) -> None:
    with pytest.raises(bed.TestbedError, match="names node09, not among node01..node04"):
        bed.up(4, FaultPlan(nodes={"node09": ["down"]}), state_dir=tmp_path / "x", prefix="catd")
    with pytest.raises(ValueError, match="GPU 7 does not exist"):
        bed.up(2, FaultPlan(nodes={"node01": [{"pcie_width": {"gpu": 7, "width": 8}}]}), state_dir=tmp_path / "x",
               prefix="catd", subnet="10.254.40.0/24")  # fmt: skip
    in_use = r"subnet 10.254.32.0/25 is already in use here \(10.254.32.1/24 on catbbr0"
    with pytest.raises(bed.TestbedError, match=in_use):
        bed.up(2, state_dir=tmp_path / "x", prefix="catd", subnet="10.254.32.0/25")
    assert _leftovers("catd", tmp_path / "x") == []
