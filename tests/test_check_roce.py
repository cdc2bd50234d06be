"""The RoCE GID check against a sysfs-shaped tree (the layout of Documentation/ABI/testing/sysfs-class-infiniband,
the GID table of a ConnectX port with an IPv4 address on its netdev), run through the real command."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from cluster_accept.checks import roce
from cluster_accept.checks.base import ClusterView
from cluster_accept.inventory.model import Profile

# Index -> (GID, type) as mlx5 populates a port whose netdev has a link-local and one IPv4 address.
TABLE = {
    0: ("fe80:0000:0000:0000:a288:c2ff:fe3b:506a", "IB/RoCE v1"),
    1: ("fe80:0000:0000:0000:a288:c2ff:fe3b:506a", "RoCE v2"),
    2: ("0000:0000:0000:0000:0000:ffff:0ac8:010a", "IB/RoCE v1"),
    3: ("0000:0000:0000:0000:0000:ffff:0ac8:010a", "RoCE v2"),
}


def _tree(root: Path, layer: str = "Ethernet", table: dict[int, tuple[str, str]] = TABLE) -> Path:
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs" / "types").mkdir(parents=True)
    (port / "gid_attrs" / "ndevs").mkdir(parents=True)
    (port / "link_layer").write_text(layer + "\n")
    for index in range(8):  # the kernel lists every slot; unused ones read as zeros
        gid, kind = table.get(index, (roce._EMPTY, ""))
        (port / "gids" / str(index)).write_text(gid + "\n")
        if kind:
            (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
            (port / "gid_attrs" / "ndevs" / str(index)).write_text("eth2\n")
    return root


def _run(root: Path, home: Path, gid_index: str | None) -> roce.RoceGids:
    env = {k: v for k, v in os.environ.items() if k != "NCCL_IB_GID_INDEX"}
    env.update({"CLUSTER_ACCEPT_SYSFS": str(root), "HOME": str(home)})
    if gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = gid_index
    proc = subprocess.run(["sh", "-c", roce.COMMAND], capture_output=True, text=True, env=env, timeout=30, check=True)
    assert proc.stderr == ""
    return roce.parse(proc.stdout, 0)


def _rows(model: roce.RoceGids) -> list[tuple[str, str, str, str | None, str | None]]:
    return [
        (r.item, r.status.value, r.reason, r.observed, r.expected)
        for r in roce.evaluate(model, Profile(), ClusterView({}, 0))
    ]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("3", ("mlx5_0/1", "pass", "ok", "3: RoCE v2", "3: RoCE v2")),
        ("2", ("mlx5_0/1", "fail", "gid_not_roce_v2", "2: IB/RoCE v1", "2: RoCE v2")),  # seed 002's trap
        ("6", ("mlx5_0/1", "fail", "gid_empty", "6: empty", "6: RoCE v2")),
        (None, ("mlx5_0/1", "pass", "ok", "RoCE v2 at 1, 3", "RoCE v2")),  # NCCL 2.21+ selects it
    ],
)
def test_the_gid_index_a_job_uses_must_name_a_roce_v2_entry(
    tmp_path: Path, setting: str | None, expected: tuple
) -> None:
    model = _run(_tree(tmp_path / "sys"), tmp_path, setting)
    assert model.error is None and [g.index for g in model.ports["mlx5_0/1"]] == [0, 1, 2, 3]
    assert _rows(model) == [expected]


@pytest.mark.integration
def test_the_index_set_in_nccl_conf_counts_and_the_environment_wins(tmp_path: Path) -> None:
    (tmp_path / ".nccl.conf").write_text("NCCL_DEBUG=WARN\nNCCL_IB_GID_INDEX=2\n")
    root = _tree(tmp_path / "sys")
    assert _rows(_run(root, tmp_path, None))[0][2] == "gid_not_roce_v2"
    assert _rows(_run(root, tmp_path, "3"))[0][2] == "ok"


@pytest.mark.integration
def test_a_port_without_any_roce_v2_address_and_a_node_without_roce(tmp_path: Path) -> None:
    v1_only = {0: TABLE[0], 2: TABLE[2]}
    assert _rows(_run(_tree(tmp_path / "v1", table=v1_only), tmp_path, None))[0][2] == "no_roce_v2_gid"
    infiniband = _run(_tree(tmp_path / "ib", layer="InfiniBand"), tmp_path, None)
    assert _rows(infiniband) == [("ports", "skip", "no_roce_ports", "0 RoCE ports", None)]


@pytest.mark.parametrize(
    "stdout", ["", "### gid index x\n### roce gids\n### end\n", "### gid index \n### roce gids\nzz\n### end\n"]
)
def test_unreadable_output_is_an_error_row(stdout: str) -> None:
    assert [r.reason for r in roce.evaluate(roce.parse(stdout, 0), Profile(), ClusterView({}, 0))] == [
        "unparsable_output"
    ]


@pytest.mark.integration
def test_a_user_conf_linked_to_dev_zero_is_not_followed_and_etc_still_counts(tmp_path: Path) -> None:
    """A job's user links ``~/.nccl.conf`` to /dev/zero: the reader neither follows it nor waits, and the index
    comes from the next file NCCL reads (here none: NCCL selects a RoCE v2 entry itself)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").symlink_to("/dev/zero")
    started = time.monotonic()
    model = _run(_tree(tmp_path / "sys"), home, None)
    assert time.monotonic() - started < 10
    assert _rows(model) == [("mlx5_0/1", "pass", "ok", "RoCE v2 at 1, 3", "RoCE v2")]
