"""Fabric profiles: ``fabric: auto`` (the default on every built-in base, named or auto) reads what is expected
between nodes from the nodes; a built-in fabric by name states it when the inventory loads; ``none`` states
nothing; the profile's own keys win over either, key by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.checks import infiniband as ib
from cluster_accept.checks.base import Status
from cluster_accept.inventory.builtin import builtin_profile, with_base
from cluster_accept.inventory.fabric import BUILTIN_FABRICS
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Inventory, Node, Profile, SshSettings
from cluster_accept.tasks.preflight.auto_profile import resolve_auto_nodes
from tests.test_fabric import HALF, _gpus, ib_node, ports_output


def _profile(**keys: object) -> Profile:
    return with_base(Profile.model_validate(keys))


def test_a_named_fabric_states_ports_rate_transport_and_floor_when_the_inventory_loads() -> None:
    profile = _profile(base="h100-sxm", fabric="infiniband-ndr", training={"enabled": True})
    assert profile.infiniband is not None
    assert (profile.infiniband.ports, profile.infiniband.rate_gbps, profile.infiniband.width) == (8, 400.0, "4X")
    assert profile.infiniband.peermem is True  # GPUDirect RDMA: nvidia_peermem or dma-buf
    assert profile.probes.expected_transport.inter_node == "NET/IB"
    assert profile.probes.expected_transport.intra_node == "P2P"  # the GPU profile's key is still there
    assert profile.thresholds.allreduce_inter_busbw_gbps_min == 200.0  # 0.5 of 8 x 400 Gb/s = 400 GB/s
    assert profile.thresholds.training_scaling_efficiency_min == 0.6
    p5 = _profile(base="h100-sxm", fabric="aws-p5", training={"enabled": False})
    assert p5.probes.expected_transport.inter_node == "NET/Libfabric"
    assert p5.infiniband is not None and (p5.infiniband.ports, p5.infiniband.width) == (32, None)
    assert p5.thresholds.allreduce_inter_busbw_gbps_min == 200.0  # 32 x 100 Gb/s
    assert p5.thresholds.training_scaling_efficiency_min is None  # training is off


def test_own_keys_win_over_a_named_fabric_key_by_key() -> None:
    profile = _profile(
        fabric="spectrum-x-roce", infiniband={"ports": 4}, thresholds={"allreduce_inter_busbw_gbps_min": 150}
    )
    assert profile.infiniband is not None and (profile.infiniband.ports, profile.infiniband.rate_gbps) == (4, 400.0)
    assert profile.thresholds.allreduce_inter_busbw_gbps_min == 150
    assert profile.probes.expected_transport.inter_node == "NET/IB"
    plain = _profile(base="h200-sxm", fabric="ethernet")
    assert plain.probes.expected_transport.inter_node == "NET/Socket"
    assert plain.thresholds.allreduce_inter_busbw_gbps_min is None and plain.infiniband is None


def test_an_unknown_fabric_is_refused_at_load_naming_the_built_in_ones(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "cluster: c\nnodes: [{hosts: n1}]\ndefaults: {profile: p}\nprofiles:\n  p: {base: h100-sxm, fabric: ndr}\n"
    )
    with pytest.raises(InventoryError) as caught:
        load_inventory(inventory)
    said = str(caught.value)
    assert "profiles.p" in said and "fabric 'ndr' is not a built-in fabric" in said, said
    for name in ("auto", *BUILTIN_FABRICS, "none"):
        assert name in said


def _resolve(profile: Profile, outputs: dict[str, str]) -> tuple[Inventory, dict[str, object]]:
    nodes = [Node(n, SshSettings(), "p", profile) for n in outputs]
    inventory = Inventory("c", nodes, {"p": profile}, "inv.yaml", "x")
    nic_models = {n: ib.parse(out, 0) for n, out in outputs.items()}
    resolved, rows = resolve_auto_nodes("r", inventory, {n: _gpus(8) for n in outputs}, list(outputs), nic_models)
    return resolved, {row.node: row for row in rows if row.item == "fabric"}


def test_a_built_in_profile_by_name_derives_the_fabric_from_the_nodes_under_its_own_keys() -> None:
    outputs = {"n1": ib_node(), "n2": ib_node(), "n3": ib_node(rate=HALF)}
    named = builtin_profile("h100-sxm")
    assert named is not None
    resolved, rows = _resolve(named, outputs)
    profile = resolved.node("n3").profile
    assert profile.infiniband is not None and profile.infiniband.rate_gbps == 400.0
    assert profile.thresholds.allreduce_inter_busbw_gbps_min == 200.0
    assert profile.thresholds.gemm_bf16_tflops_min == named.thresholds.gemm_bf16_tflops_min
    assert resolved.node("n3").profile_name == "p"
    assert {(n, r.status, r.reason) for n, r in rows.items()} == {  # type: ignore[attr-defined]
        (n, Status.PASS, "fabric_derived") for n in outputs
    }
    own = _profile(base="h100-sxm", infiniband={"ports": 4, "rate_gbps": 200})
    resolved, _ = _resolve(own, outputs)
    kept = resolved.node("n1").profile
    assert kept.infiniband is not None and (kept.infiniband.ports, kept.infiniband.rate_gbps) == (4, 200)
    assert kept.thresholds.allreduce_inter_busbw_gbps_min == 200.0  # derived from the majority's ports


def test_a_named_fabric_is_not_replaced_by_what_the_nodes_show_and_none_states_nothing() -> None:
    outputs = {n: ports_output([], ("eth0 100000 up",)) for n in ("n1", "n2")}  # no RDMA port anywhere
    resolved, rows = _resolve(_profile(base="h100-sxm", fabric="infiniband-hdr"), outputs)
    profile = resolved.node("n1").profile
    assert profile.infiniband is not None and profile.infiniband.rate_gbps == 200.0
    row = rows["n1"]
    assert (row.status, row.reason, row.observed, row.expected) == (  # type: ignore[attr-defined]
        Status.PASS,
        "fabric_named",
        "a 100 Gb/s Ethernet link, no RDMA port",
        "8 × 200 Gb/s InfiniBand ports (4X)",
    )
    resolved, rows = _resolve(_profile(base="h100-sxm", fabric="none"), outputs)
    assert resolved.node("n1").profile.probes.expected_transport.inter_node is None
    assert {r.reason for r in rows.values()} == {"fabric_none"}  # type: ignore[attr-defined]


def test_a_profile_without_a_base_derives_only_when_it_says_fabric_auto() -> None:
    outputs = {"n1": ib_node(), "n2": ib_node()}
    resolved, rows = _resolve(Profile(), outputs)
    assert resolved.node("n1").profile.infiniband is None and rows == {}
    resolved, rows = _resolve(Profile(fabric="auto"), outputs)
    assert resolved.node("n1").profile.probes.expected_transport.inter_node == "NET/IB"
    assert {r.reason for r in rows.values()} == {"fabric_derived"}  # type: ignore[attr-defined]
