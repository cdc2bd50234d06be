"""The inventory contract: the shipped contract file loads unchanged; broken files fail naming the key."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster_accept.flows.cli import app
from cluster_accept.inventory.hostlist import HostlistError, describe_folded, expand, fold
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import MinVersion
from tests.keys import operator_home
from tests.processes import run_cli

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "cluster_accept" / "inventory" / "examples" / "contract.yaml"
SHARED_CONTRACT = ROOT.parent / "shared" / "contract" / "inventory.yaml"


def test_contract_copy_is_unchanged() -> None:
    if not SHARED_CONTRACT.is_file():
        pytest.skip("../shared/contract is not beside this checkout")
    assert CONTRACT.read_bytes() == SHARED_CONTRACT.read_bytes()


def test_contract_loads_with_every_key_meaning_what_it_says() -> None:
    inv = load_inventory(CONTRACT, check_files=False)  # its key and known_hosts are the operator's
    assert inv.cluster == "spectrumx-h200"
    names = [n.name for n in inv.nodes]
    assert names == ["node001", "node002", "node003", "node004", "node005", "node006", "node007", "node009", "node010"]
    assert [n.name for n in inv.excluded] == ["node004"]
    assert len(inv.tested) == 8
    n1 = inv.node("node001")
    assert (n1.ssh.user, n1.ssh.port, n1.ssh.jump) == ("ops", 22, "bastion.example.net")
    assert (n1.ssh.host_key_policy, n1.ssh.connect_timeout_s, n1.ssh.command_timeout_s) == ("strict", 10, 120)
    assert n1.ssh.identity_file == "~/.ssh/id_ed25519" and n1.ssh.known_hosts == "~/.ssh/known_hosts"
    assert n1.labels == {"rack": "r01"} and n1.connect_host == "node001"
    n10 = inv.node("node010")
    assert (n10.address, n10.ssh.port, n10.ssh.user, n10.labels) == ("10.20.0.10", 2222, "root", {"rack": "r02"})
    assert n10.ssh.identity_file == "~/.ssh/id_ed25519"  # merged from defaults
    assert n10.connect_host == "10.20.0.10"
    p = n1.profile
    assert p.gpu is not None and (p.gpu.model, p.gpu.count) == ("NVIDIA H200", 8)
    assert p.driver_version == "580.159.04" and p.cuda_version == "13.0" and p.persistence_mode == "enabled"
    assert p.nvlink is not None and (p.nvlink.links_per_gpu, p.nvlink.link_speed_gbps) == (18, 26.562)
    assert p.pcie is not None and (p.pcie.gen, p.pcie.width) == (5, 16)
    assert p.nccl_env == {
        "NCCL_IB_DISABLE": "0",
        "NCCL_SOCKET_IFNAME": "bond0",
        "NCCL_BUFFSIZE": "8388608",
        "NCCL_P2P_LEVEL": "NVL",
    }
    assert (p.probes.python, p.probes.device) == ("/opt/pytorch/bin/python", "cuda")
    assert (p.probes.expected_transport.intra_node, p.probes.expected_transport.inter_node) == ("P2P", "NET/IB")
    t = p.thresholds
    assert (t.gemm_bf16_tflops_min, t.hbm_copy_gbps_min) == (600, 3800)
    assert (t.allreduce_intra_busbw_gbps_min, t.allreduce_inter_busbw_gbps_min) == (300, 40)
    assert (t.straggler_pct, t.scaling_efficiency_min) == (5, 0.90)


def test_min_driver_version_and_named_profile_file(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "small.yaml").write_text("driver_version: {min: '570.0'}\ngpu: {model: X, count: 2}\n")
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text("cluster: c\ndefaults: {profile: small}\nnodes: [{hosts: 'gpu[1-3]'}]\n")
    inv = load_inventory(inv_path)
    assert [n.name for n in inv.nodes] == ["gpu1", "gpu2", "gpu3"]
    assert inv.nodes[0].profile.driver_version == MinVersion(min="570.0")


@pytest.mark.parametrize("minimum", ["latest", "", "r580", "580.x"])
def test_a_min_driver_version_of_other_than_numbers_is_refused(tmp_path: Path, minimum: str) -> None:
    """A minimum is compared number by number: one with no number in it ('latest') would be met by every driver
    installed, and one with letters is read as the numbers alone; both are refused when the inventory loads."""
    profile = f"{{driver_version: {{min: '{minimum}'}}}}"
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(f"cluster: c\ndefaults: {{profile: p}}\nnodes: [{{hosts: n1}}]\nprofiles:\n  p: {profile}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(inv_path)
    assert any("driver_version" in problem and "min" in problem for problem in info.value.problems), info.value


def test_hostlists_expand_and_fold() -> None:
    assert expand("node[001-003,009]") == ["node001", "node002", "node003", "node009"]
    assert fold(["node001", "node002", "node003", "node010"]) == "node[001-003,010]"
    values = {f"node{i:03d}": "580.159.04" for i in range(1, 8)} | {"node010": "570.86.15"}
    assert describe_folded(values) == "580.159.04 on node[001-007]; 570.86.15 on node010"
    for bad in ("node[1-", "node[3-1]", "@rack1", "a;b", "-oProxyCommand=x", ""):
        with pytest.raises(HostlistError):
            expand(bad)


BASE = """\
cluster: c
defaults:
  profile: p
  ssh: {user: ops, port: 22}
nodes:
  - hosts: node[1-2]
profiles:
  p: {gpu: {model: NVIDIA H200, count: 8}}
"""

BROKEN = {
    "unknown key": (BASE.replace("user: ops", "usr: ops"), "defaults.ssh.usr: unknown key"),
    "bad hostlist": (BASE.replace("node[1-2]", "node[1-"), "nodes[0].hosts"),
    "missing profile": (BASE.replace("profile: p", "profile: nope"), "defaults.profile: profile 'nope'"),
    "wrong type": (BASE.replace("count: 8", "count: many"), "profiles.p.gpu.count"),
    "empty nodes": (BASE.replace("  - hosts: node[1-2]\n", "").replace("nodes:", "nodes: []"), "nodes: empty"),
    "duplicate node": (BASE.replace("  - hosts: node[1-2]", "  - hosts: node[1-2]\n  - hosts: node2"), "node2"),
    "bad port": (BASE.replace("port: 22", "port: 70000"), "defaults.ssh.port"),
    "duplicate yaml key": (BASE.replace("cluster: c", "cluster: c\ncluster: d"), "given twice"),
    "exclude unknown node": (BASE + "exclude: [node9]\n", "exclude[0]: node node9"),
    "one address many nodes": (
        BASE.replace("hosts: node[1-2]", "hosts: node[1-2]\n    address: 10.0.0.1"),
        "nodes[0].address",
    ),
    "bad host key policy": (
        BASE.replace("port: 22", "port: 22, host_key_policy: trust-all"),
        "defaults.ssh.host_key_policy",
    ),
    "negative timeout": (BASE.replace("port: 22", "port: 22, connect_timeout_s: -1"), "defaults.ssh.connect_timeout_s"),
    "missing cluster": (BASE.replace("cluster: c\n", ""), "cluster: required key is missing"),
    "driver as float": (BASE.replace("count: 8}", "count: 8}, driver_version: 570.86"), "profiles.p.driver_version"),
    "hostile node name": (BASE.replace("node[1-2]", "'n1;reboot'"), "nodes[0].hosts"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_inventory_exits_2_naming_the_key(case: str, tmp_path: Path) -> None:
    text, expected = BROKEN[case]
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)
    result = CliRunner().invoke(app, ["inventory", "check", str(path)])
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output


def test_inventory_check_prints_folded_nodes_per_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(operator_home(tmp_path)))  # the key and known_hosts the contract names
    result = CliRunner().invoke(app, ["inventory", "check", str(CONTRACT)])
    assert result.exit_code == 0, result.output
    assert "node[001-003,005-007,009-010]" in result.output
    assert "h200-sxm" in result.output
    assert "excluded: node004" in result.output


@pytest.mark.integration
def test_real_cli_process_reports_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(BROKEN["unknown key"][0]))
    proc = run_cli("inventory", "check", str(path), timeout=60)
    assert proc.returncode == 2
    assert "defaults.ssh.usr: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_nodes_are_found_by_name_in_the_inventory_they_belong_to(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: 'gpu[001-300]'}]\nprofiles: {p: {}}\n")
    inventory = load_inventory(path)
    assert [inventory.node(f"gpu{i:03d}").name for i in (1, 150, 300)] == ["gpu001", "gpu150", "gpu300"]
    fewer = dataclasses.replace(inventory, nodes=inventory.nodes[:2])  # a new inventory: its own index
    assert fewer.node("gpu002") is inventory.node("gpu002")
    with pytest.raises(KeyError, match="gpu150"):
        fewer.node("gpu150")
    assert fewer == dataclasses.replace(fewer)  # the index is not one of the fields
