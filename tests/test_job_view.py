"""Checks that describe a job's environment run behind ``probes.command_prefix``, as the probes do: with a
container prefix they read the container's NCCL settings, not the host's. The prefix here is ``env …``, a
stand-in for ``docker exec trainer`` that changes what the command sees in the same way."""

from __future__ import annotations

import pytest

from cluster_accept.checks.base import discover
from cluster_accept.inventory.model import DEFAULT_SSH, LOCAL_ADDRESS, Node, ProbeSettings, Profile
from cluster_accept.tasks.preflight.check_batch import commands_for, run_preflight_on_node

CHECKS = {c.name: c for c in discover()}


def _node(prefix: str | None) -> Node:
    profile = Profile(probes=ProbeSettings(command_prefix=prefix))
    return Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS)


def test_job_view_checks_are_the_environment_and_version_checks() -> None:
    # and the probe interpreter: the probes run behind the prefix, so their Python and torch are the ones there
    assert {c.name for c in CHECKS.values() if c.job_view} >= {"cuda", "nccl_env", "nccl_harmful", "probe"}
    commands = {c.name: c.script for c in commands_for(list(CHECKS.values()), _node("docker exec trainer"))}
    for check in CHECKS.values():  # each discovered check: behind the prefix exactly when it declares job_view
        behind = commands[check.name].startswith("docker exec trainer sh -c ")
        assert behind is check.job_view, check.name
        assert behind or commands[check.name] == check.command, check.name
    assert commands["driver"] == CHECKS["driver"].command  # the host's driver is the host's
    assert commands_for([CHECKS["nccl_env"]], _node(None))[0].script == CHECKS["nccl_env"].command


@pytest.mark.integration
def test_the_environment_behind_the_prefix_is_the_one_judged() -> None:
    checks = [CHECKS["nccl_env"], CHECKS["nccl_harmful"]]
    inside = run_preflight_on_node(_node("env NCCL_P2P_DISABLE=1 NCCL_ALGO=Ring"), checks)
    env = inside.models["nccl_env"].effective
    assert (env["NCCL_P2P_DISABLE"].value, env["NCCL_P2P_DISABLE"].source) == ("1", "env")
    assert inside.models["nccl_harmful"].setting("NCCL_ALGO").value == "Ring"
    host = run_preflight_on_node(_node(None), checks)
    assert "NCCL_ALGO" not in host.models["nccl_env"].effective


def test_the_profiles_gpu_partition_reaches_every_probe_inside_the_prefix() -> None:
    from cluster_accept.probes.scripts import allreduce_command, gpu_bench_command

    profile = Profile(probes=ProbeSettings(command_prefix="docker exec trainer", cuda_visible_devices="2,3"))
    node = Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS)
    bench = gpu_bench_command(node)
    assert "exec docker exec trainer env CUDA_VISIBLE_DEVICES=2,3 python3 gpu_bench.py" in bench
    allreduce = allreduce_command(node)
    assert allreduce is not None and "n=2; " in allreduce  # two GPUs of the partition, not the node's count
    assert "exec docker exec trainer env CUDA_VISIBLE_DEVICES=2,3 NCCL_DEBUG=INFO python3 -m torch" in allreduce
