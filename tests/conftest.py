"""Shared fixtures: the test tiers, the ``testbed`` tier (simulated GPU nodes with real sshd) and when it is
skipped.

Every test is in one tier: ``integration`` (Prefect, the CLI, subprocesses, servers, virtual environments),
``testbed`` or ``gpu`` where it says so, else ``unit`` (pure code: the pre-commit loop, ``pytest -m unit``).
A unit test that starts a process or opens a listening socket fails with a message that says to mark it
``integration``, so that the tier stays what its name says. A test also marked ``soak`` (a long-horizon or
statistical claim, or an end-to-end run of minutes still without a lighter form) runs only when the ``-m``
expression names that tier: ``pytest -m soak``.

``testbed_factory`` brings test-beds up on demand and guarantees they go down: at the end of the session
(``finally``), at interpreter exit if the session is torn down abnormally (``atexit``), and before every
``up`` the same names are cleaned (leftovers of an interrupted earlier session). A call with the same
arguments as a running test-bed of that prefix returns it again instead of restarting it; a test that
changes a shared test-bed at run time (``kill_sshd``, ``set_rate``, ``set_fault``) must restore it.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import socket
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster_accept.testbed import bed
from cluster_accept.testbed.faults import FaultPlan, fault_plan_from_data

TestbedFactory = Callable[..., bed.Testbed]


@functools.lru_cache(maxsize=1)
def testbed_unavailable() -> str | None:
    """Why the testbed tier cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the testbed tier needs root (network namespaces, a bridge, mounts); run as root to include it"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"the testbed tier needs '{tool}' (iproute2/util-linux), not found"
    try:
        proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"'ip netns' is unavailable: {exc}"
    if proc.returncode != 0:
        return f"'ip netns' is unavailable: {proc.stderr.strip()}"
    if not Path("/usr/sbin/sshd").exists() and shutil.which("apt-get") is None:
        return "no /usr/sbin/sshd and no apt-get to install openssh-server"
    if shutil.which("ssh") is None:
        return "the testbed tier needs the OpenSSH client (ssh)"
    return None


TIERS = ("integration", "testbed", "gpu")  # a test in none of these is a unit test


def _soak_left_out(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ``soak`` test runs only when the ``-m`` expression names the tier (``pytest -m soak``): its claim is
    long-horizon or statistical, or its run takes minutes of probes, and the default run (CI's) keeps to the rest."""
    if "soak" in (config.option.markexpr or ""):
        return
    soak = [item for item in items if item.get_closest_marker("soak") is not None]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if item.get_closest_marker("soak") is None]


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _soak_left_out(config, items)
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.unit)
    tier = [item for item in items if item.get_closest_marker("testbed") is not None]
    reason = testbed_unavailable() if tier else None
    if reason:
        for item in tier:
            item.add_marker(pytest.mark.skip(reason=reason))


def _not_in_a_unit_test(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"a unit test {what}: mark the test (or its module) pytest.mark.integration")

    return refuse


@pytest.fixture(autouse=True)
def _unit_tests_stay_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests start no process and serve nothing: the tier runs anywhere, fast."""
    if request.node.get_closest_marker("unit") is None:
        return
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _not_in_a_unit_test("started a process"))
    monkeypatch.setattr(os, "fork", _not_in_a_unit_test("forked"))
    monkeypatch.setattr(socket.socket, "listen", _not_in_a_unit_test("opened a listening socket"))


def _sshds_alive(tb: bed.Testbed) -> bool:
    """Every node that should have an sshd still has it (a test may have killed one)."""
    for node in tb.nodes:
        if tb.faults.has(node, "down"):
            continue
        try:
            pid = int((tb.node_dir(node) / "sshd.pid").read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return False
    return True


@pytest.fixture(scope="session")
def testbed_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestbedFactory]:
    """``testbed_factory(nodes=8, faults=plan, prefix="cax", subnet="10.254.40.0/24", base="h200x4", rails=0)``;
    ``slurm=True`` (with ``slurm_names``, ``health_check``, ``health_check_env``) runs a real Slurm on it."""
    reason = testbed_unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("testbeds")
    running: dict[str, tuple[str, bed.Testbed]] = {}

    def down_all() -> None:
        for prefix, (_, tb) in list(running.items()):
            try:
                bed.down(tb.state_dir, prefix)
            except Exception as exc:  # keep taking the others down
                warnings.warn(f"test-bed {prefix} did not come down cleanly: {exc}", stacklevel=1)
            running.pop(prefix, None)

    atexit.register(down_all)

    def factory(
        nodes: int = 4,
        faults: FaultPlan | dict[str, Any] | None = None,
        prefix: str = "cat",
        subnet: str = "10.254.200.0/24",
        base: str = "h200x4",
        rails: int = 0,
        slurm: bool = False,
        slurm_names: dict[str, str] | None = None,
        health_check: str | None = None,
        health_check_env: dict[str, str] | None = None,
    ) -> bed.Testbed:
        plan = faults if isinstance(faults, FaultPlan) else fault_plan_from_data(faults)
        slurm_key = [slurm, slurm_names, health_check, health_check_env]
        key = json.dumps([nodes, plan.as_yaml(), subnet, base, rails, slurm_key], sort_keys=True)
        if prefix in running:
            old_key, tb = running.pop(prefix)
            if old_key == key and _sshds_alive(tb):
                running[prefix] = (old_key, tb)
                return tb
            bed.down(tb.state_dir, prefix)
        state_dir = root / prefix
        bed.down(state_dir, prefix)  # leftovers with the same names, e.g. from an interrupted session
        try:
            tb = bed.up(
                nodes, plan, state_dir=state_dir, prefix=prefix, subnet=subnet, base=base, rails=rails,
                slurm_on=slurm, slurm_names=slurm_names, health_check=health_check, health_check_env=health_check_env,
            )  # fmt: skip
        except BaseException:
            bed.down(state_dir, prefix)
            raise
        running[prefix] = (key, tb)
        return tb

    try:
        yield factory
    finally:
        down_all()
        atexit.unregister(down_all)
