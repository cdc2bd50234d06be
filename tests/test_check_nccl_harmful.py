"""The nccl_harmful check: settings that cripple or misroute a job, named with where they were set, on the
real 4 x H200 environment and NVLink captures (72 active links, 4 GPUs) with faulty variants derived."""

from __future__ import annotations

import subprocess

import pytest

import cluster_accept.checks.nccl_harmful as harmful
from cluster_accept.checks.base import Status
from cluster_accept.inventory.model import ExpectedTransport, HarmfulSetting, ProbeSettings, Profile
from tests.capture import NO_CLUSTER, captured

NVLINK_NODE = Profile()  # no expectations at all: the node's own NVLinks make P2P matter
IB_CLUSTER = Profile(probes=ProbeSettings(expected_transport=ExpectedTransport(inter_node="NET/IB")))


def capture_env() -> dict[str, str]:
    stdout, _ = captured("h200x4", "env-nccl.txt")
    return dict(line.split("=", 1) for line in stdout.splitlines())


def node_output(
    env: dict[str, str] | None = None,
    etc: str = "",
    interfaces: str = "eth0 up\nlo unknown\n",
    hcas: str = "",
    nvlinks: int | None = None,
) -> str:
    """What COMMAND prints on the captured 4 x H200 node, with ``env`` added to its session environment."""
    session = {**capture_env(), **(env or {})}
    env_lines = "".join(f"{k}={v}\n" for k, v in sorted(session.items()) if k.startswith(("NCCL", "CUDA_VISIBLE")))
    gpus = captured("h200x4", "nvidia-smi-L.txt")[0].count("\nGPU ") + 1
    links = captured("h200x4", "nvlink-s.txt")[0].count("GB/s") if nvlinks is None else nvlinks
    return (
        f"### env\n{env_lines}### /etc/nccl.conf\n{etc}### ~/.nccl.conf\n### end\n"
        f"### net\n{interfaces}### hca\n{hcas}### gpus\n{gpus}\n### nvlink\n{links}\n### facts end\n"
    )


def judged(text: str, profile: Profile = NVLINK_NODE) -> list[tuple[str, Status, str, str | None]]:
    return [
        (r.item, r.status, r.reason, r.observed) for r in harmful.evaluate(harmful.parse(text), profile, NO_CLUSTER)
    ]


def test_the_captured_node_is_clean_and_says_what_it_read() -> None:
    facts = harmful.parse(node_output())
    assert (facts.gpus, facts.nvlinks_active) == (4, 72)
    rows = harmful.evaluate(facts, NVLINK_NODE, NO_CLUSTER)
    assert [(r.item, r.status, r.reason) for r in rows] == [("settings", Status.PASS, "ok")]
    assert rows[0].observed == "2 settings read, none harmful"  # NCCL_NVLS_ENABLE, NCCL_VERSION


def test_p2p_disabled_in_etc_nccl_conf_is_named_with_its_file() -> None:
    rows = harmful.evaluate(harmful.parse(node_output(etc="NCCL_P2P_DISABLE=1\n")), NVLINK_NODE, NO_CLUSTER)
    assert [(r.item, r.status, r.reason, r.observed) for r in rows] == [
        ("NCCL_P2P_DISABLE", Status.FAIL, "p2p_disabled", "NCCL_P2P_DISABLE=1")
    ]
    assert rows[0].detail.startswith("set in /etc/nccl.conf: NCCL uses shared memory (SHM) instead of NVLink")
    # The job environment wins over the file: NCCL_P2P_DISABLE=0 in the session makes it harmless.
    assert judged(node_output({"NCCL_P2P_DISABLE": "0"}, etc="NCCL_P2P_DISABLE=1\n"))[0][2] == "ok"


def test_without_nvlink_p2p_settings_do_not_matter() -> None:
    text = node_output({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "LOC"}, nvlinks=0)
    assert judged(text) == [("settings", Status.PASS, "ok", "4 settings read, none harmful")]


def test_p2p_level_loc_and_shm_disable_together_leave_sockets() -> None:
    text = node_output({"NCCL_P2P_LEVEL": "LOC", "NCCL_SHM_DISABLE": "1"})
    assert judged(text) == [
        ("NCCL_P2P_LEVEL", Status.FAIL, "p2p_level_low", "NCCL_P2P_LEVEL=LOC"),
        ("NCCL_SHM_DISABLE", Status.FAIL, "shm_disabled", "NCCL_SHM_DISABLE=1"),
    ]
    assert judged(node_output({"NCCL_P2P_LEVEL": "NVL", "NCCL_SHM_DISABLE": "1"}))[0][2] == "ok"


def test_infiniband_turned_off_where_the_profile_expects_it() -> None:
    text = node_output({"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket"})
    assert judged(text, IB_CLUSTER) == [
        ("NCCL_IB_DISABLE", Status.FAIL, "ib_disabled", "NCCL_IB_DISABLE=1"),
        ("NCCL_NET", Status.FAIL, "net_forced", "NCCL_NET=Socket"),
    ]
    assert judged(text, NVLINK_NODE)[0][2] == "ok"  # no NET/IB expected: a socket cluster may set both


def test_forced_algorithm_protocol_and_debug_logging_are_warnings() -> None:
    text = node_output({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_DEBUG": "INFO"})
    assert [(item, status, reason) for item, status, reason, _ in judged(text)] == [
        ("NCCL_ALGO", Status.WARN, "algo_forced"),
        ("NCCL_PROTO", Status.WARN, "proto_forced"),
        ("NCCL_DEBUG", Status.WARN, "debug_logging"),
    ]
    assert judged(node_output({"NCCL_DEBUG": "WARN"}))[0][2] == "ok"


@pytest.mark.parametrize(
    ("ifname", "interfaces", "reason"),
    [
        ("bond0", "eth0 up\nlo unknown\n", "socket_ifname_missing"),
        ("eth", "eth0 up\nlo unknown\n", "ok"),  # a prefix, as NCCL reads it
        ("=eth", "eth0 up\nlo unknown\n", "socket_ifname_missing"),  # '=': exact names only
        ("^docker,lo", "eth0 up\n", "ok"),  # exclusions name nothing that must exist
        ("ib0", "eth0 up\nib0 down\n", "socket_ifname_missing"),  # present but down
    ],
)
def test_socket_ifname_names_an_interface_the_node_has_and_that_is_up(
    ifname: str, interfaces: str, reason: str
) -> None:
    rows = judged(node_output({"NCCL_SOCKET_IFNAME": ifname}, interfaces=interfaces))
    assert rows[0][2] == reason


def test_ib_hca_names_an_active_port() -> None:
    hcas = "mlx5_0 1 4: ACTIVE\nmlx5_1 1 1: DOWN\n"
    assert judged(node_output({"NCCL_IB_HCA": "mlx5_0:1"}, hcas=hcas))[0][2] == "ok"
    assert judged(node_output({"NCCL_IB_HCA": "mlx5_1"}, hcas=hcas))[0][2] == "ib_hca_missing"
    rows = harmful.evaluate(harmful.parse(node_output({"NCCL_IB_HCA": "mlx5_0"})), NVLINK_NODE, NO_CLUSTER)
    assert rows[0].reason == "ib_hca_missing" and "no InfiniBand device" in rows[0].detail


def test_cuda_visible_devices_hiding_gpus_unless_the_profile_partitions_the_node() -> None:
    assert judged(node_output({"CUDA_VISIBLE_DEVICES": "0,1"}))[0][:3] == (
        "CUDA_VISIBLE_DEVICES",
        Status.FAIL,
        "gpus_hidden",
    )
    assert judged(node_output({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}))[0][2] == "ok"
    partition = Profile(probes=ProbeSettings(cuda_visible_devices="0,1"))
    assert judged(node_output({"CUDA_VISIBLE_DEVICES": "0,1"}), partition)[0][2] == "ok"


def test_a_site_rule_from_the_profile() -> None:
    site = Profile(
        nccl_harmful=[HarmfulSetting(key="NCCL_NET_GDR_LEVEL", values=["LOC"], why="GPUDirect RDMA off: slow")]
    )
    rows = harmful.evaluate(harmful.parse(node_output({"NCCL_NET_GDR_LEVEL": "LOC"})), site, NO_CLUSTER)
    assert [(r.status, r.reason, r.observed, r.expected) for r in rows] == [
        (Status.FAIL, "site_rule", "NCCL_NET_GDR_LEVEL=LOC", "not LOC")
    ]
    assert rows[0].detail == "set in the job environment: GPUDirect RDMA off: slow"
    assert judged(node_output({"NCCL_NET_GDR_LEVEL": "PHB"}), site)[0][2] == "ok"
    with pytest.raises(ValueError, match="only variables starting with NCCL"):
        HarmfulSetting(key="LD_PRELOAD", why="x")


def test_truncated_output_is_an_error_row() -> None:
    text = node_output().split("### gpus")[0]
    rows = harmful.evaluate(harmful.parse(text), NVLINK_NODE, NO_CLUSTER)
    assert [(r.status, r.reason) for r in rows] == [(Status.ERROR, "unparsable_output")]


@pytest.mark.integration
def test_the_command_reads_this_machine() -> None:
    out = subprocess.run(["sh", "-c", harmful.COMMAND], capture_output=True, text=True, timeout=30, check=True).stdout
    facts = harmful.parse(out)
    assert facts.error is None and "lo" in facts.interfaces and facts.gpus is not None
