"""Per-rail verdicts on synthetic figures, what holds a rank to its rail, and the profile rules for rails."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster_accept.analysis.rails import judge_rails
from cluster_accept.inventory.model import Node, Profile, Rail, SshSettings
from cluster_accept.tasks.multi_node.ranks import rail_env, rail_job


def test_a_rail_far_below_its_siblings_is_slow_and_sets_isolations_floor() -> None:
    got = judge_rails({"rail0": 48.1, "rail1": 47.5, "rail2": 21.0, "rail3": 48.0}, None, 5.0)
    assert [(j.rail, j.ok, j.reason) for j in got] == [
        ("rail0", True, "ok"), ("rail1", True, "ok"), ("rail2", False, "below_other_rails"), ("rail3", True, "ok"),
    ]  # fmt: skip
    median = (47.5 + 48.0) / 2
    assert got[2].floor_gbps == pytest.approx(median * 0.95)
    assert got[2].expected == f">= {median * 0.95:.3g} GB/s (rails' median - 5%)"


def test_the_profile_minimum_and_a_failed_run_count_on_their_own() -> None:
    got = judge_rails({"rail0": 40.0, "rail1": None}, 45.0, 5.0)
    assert [(j.rail, j.reason) for j in got] == [("rail0", "below_min"), ("rail1", "run_failed")]
    assert got[0].floor_gbps == 45.0  # one figure: no median to compare with, the minimum alone
    alone = judge_rails({"rail0": 40.0}, None, 5.0)
    assert (alone[0].ok, alone[0].floor_gbps, alone[0].expected) == (True, None, None)  # nothing bounds one rail


def test_a_rank_is_held_to_its_rails_gpu_hca_and_interface() -> None:
    cuda = Node("n1", SshSettings(), "p", Profile.model_validate({"probes": {"cuda_visible_devices": "0,1,2,3"}}))
    rail = Rail(gpu=3, nic="mlx5_3", ifname="ib3")
    assert rail_env(cuda, rail) == {
        "CUDA_VISIBLE_DEVICES": "3",
        "NCCL_IB_HCA": "=mlx5_3",
        "NCCL_SOCKET_IFNAME": "=ib3",
        "GLOO_SOCKET_IFNAME": "ib3",
    }
    command = rail_job(rail).command(cuda, 1, 4, "10.0.0.1", 29500, "t1").script
    # the rail's GPU wins over the profile's partition; one rank per node
    assert "exec env CUDA_VISIBLE_DEVICES=3 NCCL_DEBUG=INFO NCCL_IB_HCA==mlx5_3 NCCL_SOCKET_IFNAME==ib3 " in command
    assert "n=1; " in command and "--label rail3" in command and "--node_rank=1" in command
    cpu = Node("n1", SshSettings(), "p", Profile.model_validate({"probes": {"device": "cpu"}}))
    assert rail_env(cpu, Rail(gpu=0, ifname="rail0")) == {"GLOO_SOCKET_IFNAME": "rail0"}
    assert (
        "--min-bytes 262144 --max-bytes 262144"
        in rail_job(Rail(gpu=0, ifname="rail0")).command(cpu, 0, 2, "h", 1, "t").script
    )


def test_rails_the_code_cannot_run_are_refused_when_loaded() -> None:
    with pytest.raises(ValidationError, match="on CPU \\(gloo\\) a rail needs its ifname"):
        Profile.model_validate({"probes": {"device": "cpu", "rails": [{"gpu": 0, "nic": "mlx5_0"}]}})
    with pytest.raises(ValidationError, match="name the rail's nic"):
        Profile.model_validate({"probes": {"rails": [{"gpu": 0}]}})
    with pytest.raises(ValidationError, match="GPU 1 named by more than one rail"):
        Profile.model_validate({"probes": {"rails": [{"gpu": 1, "nic": "mlx5_0"}, {"gpu": 1, "nic": "mlx5_1"}]}})
    with pytest.raises(ValidationError, match="not an interface or HCA name"):
        Profile.model_validate({"probes": {"rails": [{"gpu": 0, "nic": "mlx5_0; reboot"}]}})
    with pytest.raises(ValidationError, match="rail_busbw_gbps_min needs probes.rails"):
        Profile.model_validate({"thresholds": {"rail_busbw_gbps_min": 40}})
