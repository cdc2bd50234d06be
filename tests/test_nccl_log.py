"""Every transport shape NCCL prints, read from real 4 x H200 logs (NCCL 2.28.9) and the lines quoted in the
field reports; a probe that ran but names no transport is a warning row, never silence."""

from __future__ import annotations

import re

import pytest

from cluster_accept.analysis.nccl_log import (
    nccl_transports,
    nccl_warnings,
    normalise_transport,
    ran_nccl,
    transport_matches,
)
from cluster_accept.checks.base import Status
from cluster_accept.inventory.model import ExpectedTransport, ProbeSettings, Profile
from cluster_accept.probes import allreduce
from tests.capture import captured


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        ("nccl-allreduce-p2p-cumem.txt", {"P2P/CUMEM": 96}),
        ("nccl-allreduce-p2p-ipc.txt", {"P2P/IPC": 168}),
        ("nccl-allreduce-shm.txt", {"SHM": 16}),  # NCCL_P2P_DISABLE=1: "Channel 00 : … via SHM/direct/direct"
        ("nccl-allreduce-p2p-level-loc.txt", {"SHM": 16}),  # NCCL_P2P_LEVEL=LOC
        ("nccl-allreduce-socket.txt", {"NET/Socket": 32}),  # P2P and SHM disabled: "[send] via NET/Socket/0"
    ],
)
def test_transport_of_every_captured_log(capture: str, expected: dict[str, int]) -> None:
    text, code = captured("h200x4", capture)
    assert code == 0
    assert nccl_transports(text) == expected
    assert nccl_warnings(text) == []


# The transports quoted in seed 004 (Llama-3-8B under DeepSpeed ZeRO-3 on 4 GPUs, per topology).
SEED_004 = {
    "SHM/direct/direct": "SHM",
    "P2P/CUMEM/read": "P2P/CUMEM/read",
    "P2P/CUMEM": "P2P/CUMEM",
    "NET/Libfabric/0/GDRDMA": "NET/Libfabric/GDRDMA",
    "NET/Socket/0": "NET/Socket",
}


@pytest.mark.parametrize(("via", "name"), sorted(SEED_004.items()))
def test_seed_transports_fold_to_names_a_profile_expects(via: str, name: str) -> None:
    assert normalise_transport(via) == name


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("n:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer", {"P2P/direct": 1}),
        ("n:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/1", {"P2P": 1}),  # old NCCL: path level
        ("n:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/3/GDRDMA", {"NET/IB/GDRDMA": 1}),
        ("n:1:1 [0] NCCL INFO Channel 01/1 : 8[0] -> 0[0] [receive] via NET/IB/0", {"NET/IB": 1}),
        (
            "n:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/Libfabric/2/GDRDMA",
            {"NET/Libfabric/GDRDMA": 1},
        ),
        ("n:1:1 [0] NCCL INFO 0[0] -> 8[0] [send]    via NET/IB/0", {"NET/IB": 1}),  # no channel prefix
        ("n:1:1 [0] NCCL INFO CollNet 00/0 : 0 [send] via COLLNET/IBext/0/GDRDMA", {"COLLNET/IBext/GDRDMA": 1}),
        ("n:1:1 [0] NCCL INFO Coll 00 : 3 [send] via COLLNET/SHARP/1", {"COLLNET/SHARP": 1}),
        ("n:1:1 [0] NCCL INFO Connected NVLS tree", {"NVLS": 1}),
        ("n:1:1 [0] NCCL INFO 16 coll channels, 16 collnet channels, 16 nvls channels, 32 p2p channels", {"NVLS": 1}),
        ("n:1:1 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels", {}),
        ("n:1:1 [0] NCCL INFO Channel 00/24 : 0 1 2 3", {}),  # a ring's order, not a connection
    ],
)
def test_every_connection_shape(line: str, expected: dict[str, int]) -> None:
    assert nccl_transports(line) == expected


def test_expectations_match_by_prefix_and_gpudirect_is_demanded_only_when_named() -> None:
    assert transport_matches("P2P/CUMEM/read", "P2P") and transport_matches("P2P/IPC", "P2P")
    assert transport_matches("NET/IB/GDRDMA", "NET/IB") and transport_matches("NET/IB/GDRDMA", "NET/IB/GDRDMA")
    assert not transport_matches("NET/IB", "NET/IB/GDRDMA")
    assert not transport_matches("NET/Socket", "NET/IB") and not transport_matches("SHM", "P2P")
    assert not transport_matches("NET/IBext", "NET/IB")


def _profile(intra: str | None) -> Profile:
    return Profile(probes=ProbeSettings(expected_transport=ExpectedTransport(intra_node=intra)))


def test_p2p_disabled_fails_the_transport_check_with_shm_named() -> None:
    text, _ = captured("h200x4", "nccl-allreduce-shm.txt")
    rows = [r for r in allreduce.inspect(allreduce.parse(text), _profile("P2P")) if r.check == "transport"]
    assert [(r.status, r.reason, r.observed, r.expected) for r in rows] == [(Status.FAIL, "unexpected", "SHM", "P2P")]
    assert rows[0].detail == "SHM: 16 channel connections"


def test_a_log_without_connection_lines_is_unreadable_not_silent() -> None:
    text, _ = captured("h200x4", "nccl-allreduce-p2p-cumem.txt")
    stripped = "\n".join(line for line in text.splitlines() if not re.search(r" via ", line))
    assert ran_nccl(stripped) and nccl_transports(stripped) == {}
    rows = [r for r in allreduce.inspect(allreduce.parse(stripped), _profile("P2P")) if r.check == "transport"]
    assert [(r.status, r.reason, r.expected) for r in rows] == [(Status.WARN, "unreadable", "P2P")]
    # A probe that never started NCCL says so through its own failure row, not a transport row.
    assert [
        r for r in allreduce.inspect(allreduce.parse("Traceback ..."), _profile("P2P")) if r.check == "transport"
    ] == []


def test_nccl_warnings_lead_with_why() -> None:
    log = (
        "n:1:1 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.1<0>\n"
        "n:1:1 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<41123> failed : "
        "Software caused connection abort\n"
        "n:1:1 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<41123> failed : "
        "Software caused connection abort\n"
        "n:1:1 [0] NCCL WARN NET/Socket : no interface found matching NCCL_SOCKET_IFNAME=bond0\n"
    )
    assert nccl_warnings(log) == [
        "socketStartConnect: Connect to 10.0.0.2<41123> failed : Software caused connection abort",
        "NET/Socket : no interface found matching NCCL_SOCKET_IFNAME=bond0",
    ]
