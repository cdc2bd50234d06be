"""The test-bed: N simulated GPU nodes, each a network namespace with a real sshd, on this machine.

``up`` builds every node's data (captures + faults) first, so a bad fault plan fails before anything is
created; then the bridge, namespaces and veths (batched), keys (in-process), and the sshds (in parallel).
Everything is recorded in ``state.json`` as soon as it exists, and every resource is named from the
prefix (the test-bed's name), so ``down`` can clean up after a crash, an interrupted ``up`` or a deleted
state dir alike. Test-beds of different names run side by side, each on a subnet of its own (a free one
unless given); ``up`` never replaces a running test-bed (see :mod:`testbed.claim`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cluster_accept.testbed import claim, hgx, net, slurm, sshd, subnets
from cluster_accept.testbed.burn_faults import Cotenant, DcgmFail, NoDcgm, SdcFlip
from cluster_accept.testbed.claim import DEFAULT_NAME, TestbedError, default_state_dir
from cluster_accept.testbed.faults import FaultPlan, Slow, Slower, SlowRail, _Fault, parse_fault
from cluster_accept.testbed.ibsys import write_ib_sysfs
from cluster_accept.testbed.nodedata import NodeData, build_node, write_node_data
from cluster_accept.testbed.profile import inventory, testbed_nccl_env, write_inventory
from cluster_accept.testbed.sdcflip import write_every_slower, write_sitecustomize, write_slower
from cluster_accept.testbed.slurm_nodes import start_slurm, start_slurmd
from cluster_accept.testbed.standins import write_standins
from cluster_accept.vocabulary.own_files import check_own_dir

STATE_VERSION = 1
# Files a state dir holds; a dir with anything else and no state.json is not removed by down().
_OWN_NAMES = {"state.json", "inventory.yaml", "known_hosts", "id_ed25519", "id_ed25519.pub", "nodes", "slurm"}


@dataclass
class Testbed:
    """A running test-bed, as ``up`` made it or ``load`` reopened it."""

    __test__ = False  # not a pytest test class

    state_dir: Path
    prefix: str
    inventory_path: Path
    known_hosts_path: Path
    identity_file: Path
    nodes: dict[str, str]
    base: str = "h200x4"
    subnet: str = "10.251.0.0/22"
    host_ip: str = ""
    faults: FaultPlan = field(default_factory=FaultPlan)
    index: dict[str, int] = field(default_factory=dict)
    up_seconds: float = 0.0
    rails: int = 0  # rail networks beside eth0, each with one simulated HCA per node
    slurm: bool = False  # a real Slurm runs: slurmctld here, slurmd in every node (testbed.slurm)
    slurm_names: dict[str, str] = field(default_factory=dict)  # node -> its Slurm name, where they differ
    health_check: str = ""  # Slurm's HealthCheckProgram, run in the node's environment

    def slurm_name(self, node: str) -> str:
        return self.slurm_names.get(node, node)

    @property
    def slurm_env(self) -> dict[str, str]:
        """What Slurm's clients need to reach this test-bed's Slurm (``SLURM_CONF``)."""
        return slurm.client_env(self.state_dir)

    def sysfs_dir(self, node: str) -> Path:
        return self.node_dir(node) / "sys"

    @property
    def bridge(self) -> str:
        return net.bridge_name(self.prefix)

    def netns(self, node: str) -> str:
        return net.netns_name(self.prefix, node)

    def node_dir(self, node: str) -> Path:
        return self.state_dir / "nodes" / node

    def data_dir(self, node: str) -> Path:
        return self.node_dir(node) / "data"

    def bin_dir(self, node: str) -> Path:
        return self.node_dir(node) / "bin"

    def ssh_argv(self, node: str, command: str, connect_timeout_s: float = 5) -> list[str]:
        """An OpenSSH client command line that reaches ``node`` the way the inventory says."""
        return [
            "ssh", "-i", str(self.identity_file), "-o", f"UserKnownHostsFile={self.known_hosts_path}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"ConnectTimeout={connect_timeout_s:g}",
            f"root@{self.nodes[node]}", command,
        ]  # fmt: skip

    def state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "prefix": self.prefix,
            "state_dir": str(self.state_dir),
            "base": self.base,
            "subnet": self.subnet,
            "bridge": self.bridge,
            "host_ip": self.host_ip,
            "python": sys.executable,
            "inventory": str(self.inventory_path),
            "known_hosts": str(self.known_hosts_path),
            "identity_file": str(self.identity_file),
            "faults": self.faults.as_yaml(),
            "up_seconds": round(self.up_seconds, 3),
            "rails": self.rails,
            "slurm": {"on": self.slurm, "names": self.slurm_names, "health_check": self.health_check},
            "nodes": {
                node: {"ip": ip, "index": self.index[node], "netns": self.netns(node),
                       "veth": net.veth_name(self.prefix, self.index[node]), "dir": str(self.node_dir(node)),
                       "sshd_pid": sshd.read_pid(self.node_dir(node))}
                for node, ip in self.nodes.items()
            },
        }  # fmt: skip

    def summary(self) -> str:
        """What ``testbed up`` prints: name, size, subnet, state dir, inventory, and how to take it down."""
        text = (
            f"test-bed {self.prefix}: {len(self.nodes)} nodes up on {self.subnet}; state dir: {self.state_dir}\n"
            f"inventory: {self.inventory_path}\n"
        )
        if self.slurm:
            text += f"Slurm: export SLURM_CONF={slurm.conf_path(self.state_dir)}\n"
        return text + f"take it down with: {claim.down_command(self.prefix)}"

    def save(self) -> None:
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.state(), indent=1), encoding="utf-8")
        tmp.replace(self.state_dir / "state.json")


def node_names(count: int) -> list[str]:
    width = max(2, len(str(count)))
    return [f"node{i:0{width}d}" for i in range(1, count + 1)]


def _require_root() -> None:
    if os.geteuid() != 0:
        raise TestbedError("the test-bed needs root (network namespaces, bridges, mounts)")
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        raise TestbedError("the test-bed needs iproute2 (ip) and util-linux (unshare)")


def _node_data(base: str, node: str, faults: Sequence[_Fault], rails: int = 0) -> NodeData:
    return hgx.with_board(build_node(base, faults, testbed_nccl_env(rails), node=node), faults)


def _prepare_node(tb: Testbed, node: str, data: NodeData, client_pub: str) -> None:
    """Write the node's dir: data, stand-ins, keys, authorized_keys, sshd config and start script."""
    faults = tb.faults.faults(node)
    kinds = {f.kind for f in faults}
    ndir = tb.node_dir(node)
    shutil.rmtree(ndir, ignore_errors=True)
    ndir.mkdir(parents=True)
    write_node_data(data, tb.data_dir(node), seed=node)
    write_standins(tb.bin_dir(node), tb.data_dir(node))
    known = sshd.write_keypair(ndir / "ssh_host_ed25519_key", f"root@{node}")
    served = ndir / "ssh_host_ed25519_key"
    if "host_key_changed" in kinds:
        served = ndir / "ssh_host_ed25519_key.changed"
        sshd.write_keypair(served, f"root@{node}-reinstalled")
    (ndir / "known_host_line").write_text(f"{tb.nodes[node]} {' '.join(known.split()[:2])}\n")
    authorized = client_pub
    if "auth_refused" in kinds:
        authorized = sshd.write_keypair(ndir / "someone_else_ed25519", "someone-else@elsewhere")
    (ndir / "authorized_keys").write_text(authorized + "\n")
    env = {
        "PATH": f"{tb.bin_dir(node)}:{sshd.BASE_PATH}",
        **data.env,
        "CLUSTER_ACCEPT_TESTBED_NODE": node,
    }
    env.update(hgx.write_pci_sysfs(tb.sysfs_dir(node), tb.bin_dir(node), data, faults))
    env.update(write_ib_sysfs(tb.sysfs_dir(node), tb.bin_dir(node), tb.rails, faults))
    if sum(isinstance(f, (SdcFlip, Cotenant, Slower)) for f in faults) > 1:
        raise ValueError(f"{node}: one fault in the simulated GPUs' torch per node (sdc, cotenant or slower)")
    for fault in faults:
        if isinstance(fault, SdcFlip):
            env["PYTHONPATH"] = str(write_sitecustomize(ndir / "sdc", fault.gpu).parent)
        if isinstance(fault, Cotenant):
            env["PYTHONPATH"] = str(write_slower(ndir / "cotenant", fault.gpu, fault.after_s, fault.slowdown).parent)
        if isinstance(fault, Slower):
            env["PYTHONPATH"] = str(write_every_slower(ndir / "slower", fault.factor).parent)
        if isinstance(fault, NoDcgm):
            (tb.bin_dir(node) / "dcgmi").unlink(missing_ok=True)
    planted = [{"test": f.test, "gpu": f.gpu} for f in faults if isinstance(f, DcgmFail)]
    if planted:
        (tb.data_dir(node) / "dcgm.json").write_text(json.dumps(planted), encoding="utf-8")
    (ndir / "env.json").write_text(json.dumps(env), encoding="utf-8")  # for the programs Slurm starts
    config = sshd.sshd_config(ndir, tb.nodes[node], served, ndir / "authorized_keys", env)
    (ndir / "sshd_config").write_text(config)
    (ndir / "start.sh").write_text(sshd.start_script(ndir, tb.data_dir(node)))


def _write_known_hosts(tb: Testbed) -> None:
    lines = [(tb.node_dir(n) / "known_host_line").read_text() for n in tb.nodes]
    tb.known_hosts_path.write_text("".join(lines))


def _start_node(tb: Testbed, node: str) -> None:
    """Start sshd (unless ``down``), wait for it, then apply the link faults (``off``, ``slow``)."""
    faults = tb.faults.faults(node)
    kinds = {f.kind for f in faults}
    if "down" not in kinds:
        sshd.start(tb.netns(node), tb.node_dir(node))
        sshd.wait_listening(tb.nodes[node])
    for fault in faults:
        if isinstance(fault, Slow):
            net.set_rate(tb.prefix, node, tb.index[node], fault.rate_mbit)
        if isinstance(fault, SlowRail):
            net.set_rail_rate(tb.prefix, tb.index[node], node, fault.rail, fault.rate_mbit)
    if "off" in kinds:
        net.set_link(tb.prefix, node, tb.nodes[node], up=False)


def up(
    nodes: int,
    faults: FaultPlan | None = None,
    state_dir: Path | None = None,
    prefix: str = DEFAULT_NAME,
    subnet: str | None = None,
    base: str = "h200x4",
    rails: int = 0,
    slurm_on: bool = False,
    slurm_names: dict[str, str] | None = None,
    health_check: str | None = None,
    health_check_env: dict[str, str] | None = None,
) -> Testbed:
    """Start ``nodes`` simulated nodes (``node01``..) with ``faults`` planted; returns the running test-bed.

    ``prefix`` is the test-bed's name; ``state_dir`` defaults to ``/tmp/cluster-accept-testbed-PREFIX`` and
    ``subnet`` to a free one (:func:`testbed.subnets.free_subnet`). ``rails`` adds that many rail networks
    (``rail<k>`` in every node, one simulated HCA ``mlx5_<k>`` each) and names them in the profile.
    ``slurm_on`` starts a real Slurm (:mod:`testbed.slurm`) with node names ``slurm_names`` (node -> Slurm name;
    the node's own name otherwise) and ``health_check`` as its ``HealthCheckProgram`` (``health_check_env``: the
    site's settings it reads).

    A running test-bed of this name or state dir is never replaced: that raises :class:`TestbedError` naming
    it; a stale one (nothing of it alive) is cleaned first. On any failure, everything created so far is taken
    down again before the error propagates.
    """
    started = time.monotonic()
    net.check_name(prefix)
    _require_root()
    plan = faults or FaultPlan()
    state_dir = own_state_dir(state_dir, prefix)
    names = _checked_names(nodes, plan, subnet, prefix)
    healthy = _node_data(base, names[0], [], rails)
    data = {n: _node_data(base, n, plan.faults(n), rails) if plan.faults(n) else healthy for n in names}
    sshd.ensure_sshd()
    shape = Testbed(
        state_dir=state_dir, prefix=prefix, inventory_path=state_dir / "inventory.yaml",
        known_hosts_path=state_dir / "known_hosts", identity_file=state_dir / "id_ed25519", nodes={}, base=base,
        faults=plan, index={n: i for i, n in enumerate(names, start=1)}, rails=rails, slurm=slurm_on,
        slurm_names=dict(slurm_names or {}), health_check=health_check or "",
    )  # fmt: skip
    tb = _claimed(shape, names, ipaddress.ip_network(subnet) if subnet else None)
    try:
        _start(tb, data, health_check_env)
        tb.up_seconds = time.monotonic() - started
        tb.save()
    except BaseException:
        with contextlib.suppress(Exception):
            down(state_dir, prefix)
        raise
    return tb


def own_state_dir(given: Path | None, prefix: str) -> Path:
    """The state dir a test-bed is brought up in, resolved. The default one lies in the shared ``/tmp``: a link or
    another user's directory already holding its name is refused (root would write the test-bed's keys through
    it), never followed."""
    if given is not None:
        return Path(given).resolve()
    path = default_state_dir(prefix)
    if os.path.lexists(path):
        try:
            check_own_dir(path)
        except PermissionError as exc:
            raise TestbedError(f"{exc}: remove it, or give --state-dir") from None
    return path.resolve()


def _checked_names(nodes: int, plan: FaultPlan, subnet: str | None, prefix: str) -> list[str]:
    """The nodes' names, once the fault plan names only them, the subnet holds them and their interface names
    fit; raises :class:`TestbedError` (or ValueError for a subnet) naming what does not."""
    names = node_names(nodes) if nodes >= 1 else []
    if not names:
        raise TestbedError("a test-bed needs at least one node")
    unknown = sorted(set(plan.nodes) - set(names))
    if unknown:
        raise TestbedError(f"the fault plan names {', '.join(unknown)}, not among node01..{names[-1]}")
    if subnet:
        subnets.hosts(ipaddress.ip_network(subnet), nodes)
    net.veth_name(prefix, nodes)  # interface names must fit in 15 characters
    return names


def _claimed(shape: Testbed, names: list[str], network: Any) -> Testbed:
    """``shape`` with its subnet and addresses, claimed under the host lock (no other test-bed has this name,
    state dir or subnet), saved and its bridge up; a stale one of the same name is cleaned first."""
    with claim.host_lock():
        claim.refuse_taken(shape.state_dir, shape.prefix)
        down(shape.state_dir, shape.prefix)  # a stale test-bed of this name or state dir
        claim.refuse_foreign_links(shape.prefix)
        network = subnets.claim(network, len(names))
        hosts = subnets.hosts(network, len(names))
        nodes = dict(zip(names, hosts[1:], strict=True))
        tb = replace(shape, nodes=nodes, subnet=str(network), host_ip=hosts[0])
        try:
            tb.state_dir.mkdir(parents=True, exist_ok=True)
            tb.save()
            net.create_bridge(tb.prefix, f"{hosts[0]}/{network.prefixlen}", str(tb.state_dir))
        except BaseException:
            with contextlib.suppress(Exception):
                down(tb.state_dir, tb.prefix)
            raise
    return tb


def _start(tb: Testbed, data: dict[str, NodeData], health_check_env: dict[str, str] | None) -> None:
    """The claimed test-bed's nodes created, prepared with ``data`` and started; its inventory; its Slurm."""
    names, prefixlen = list(tb.nodes), ipaddress.ip_network(tb.subnet).prefixlen
    net.create_nodes(tb.prefix, [(n, tb.index[n], f"{tb.nodes[n]}/{prefixlen}") for n in names])
    net.create_rails(tb.prefix, tb.rails, [(n, tb.index[n]) for n in names])
    client_pub = sshd.write_keypair(tb.identity_file, f"cluster-accept-testbed-{tb.prefix}")
    net.pmap(lambda n: _prepare_node(tb, n, data[n], client_pub), names, workers=4)
    _write_known_hosts(tb)
    sshd.ensure_nccl_mountpoint()
    net.pmap(lambda n: _start_node(tb, n), names, workers=16)
    shape = inventory(tb.base, tb.nodes, tb.identity_file, tb.known_hosts_path, rails=tb.rails)
    write_inventory(tb.inventory_path, shape)
    if tb.slurm:
        start_slurm(tb, health_check_env)


def _state_dir(state_dir: Path | None, prefix: str) -> Path:
    """The given state dir, else the one the running test-bed recorded, else the name's default."""
    return Path(state_dir or claim.locate(prefix) or default_state_dir(prefix)).resolve()


def load(state_dir: Path | None = None, prefix: str = DEFAULT_NAME) -> Testbed:
    """Reopen a running test-bed from its ``state.json``."""
    net.check_name(prefix)
    state_dir = _state_dir(state_dir, prefix)
    state = claim.read_state(state_dir)
    if state is None:
        raise TestbedError(f"no test-bed state in {state_dir} (state.json missing or unreadable)")
    if state.get("prefix") != prefix:
        raise TestbedError(f"{state_dir} holds the test-bed of prefix {state.get('prefix')!r}, not {prefix!r}")
    nodes = state["nodes"]
    return Testbed(
        state_dir=state_dir, prefix=prefix, inventory_path=Path(state["inventory"]),
        known_hosts_path=Path(state["known_hosts"]), identity_file=Path(state["identity_file"]),
        nodes={n: v["ip"] for n, v in nodes.items()}, base=state["base"], subnet=state["subnet"],
        host_ip=state["host_ip"], faults=FaultPlan(nodes=state["faults"].get("nodes", {})),
        index={n: int(v["index"]) for n, v in nodes.items()}, up_seconds=float(state.get("up_seconds", 0)),
        rails=int(state.get("rails", 0)), slurm=bool(state.get("slurm", {}).get("on")),
        slurm_names=dict(state.get("slurm", {}).get("names", {})),
        health_check=str(state.get("slurm", {}).get("health_check", "")),
    )  # fmt: skip


def down(state_dir: Path | None = None, prefix: str = DEFAULT_NAME) -> None:
    """Take the test-bed down: processes, namespaces, veths, bridge, mount point, state dir. Idempotent.

    Works from ``state.json`` when there is one and from the prefix's resource names when there is not;
    never touches another prefix's resources nor a state dir that is not a test-bed's. Without
    ``state_dir``, the one the running test-bed recorded on its bridge, else the name's default.
    """
    net.check_name(prefix)
    state_dir = _state_dir(state_dir, prefix)
    state = claim.read_state(state_dir)
    owned = state.get("prefix") == prefix if state is not None else _looks_like_state_dir(state_dir)
    if owned:
        net.kill_pids(claim.own_processes(state_dir))
    net.teardown(prefix)
    sshd.release_nccl_mountpoint()
    if owned:
        shutil.rmtree(state_dir, ignore_errors=True)


def _looks_like_state_dir(state_dir: Path) -> bool:
    try:
        return all(p.name in _OWN_NAMES or p.name.startswith("state.json") for p in state_dir.iterdir())
    except OSError:
        return False


def kill_sshd(tb: Testbed, node: str) -> None:
    """The node dies: its sshd and every process in its namespace are killed (connections refused)."""
    net.kill_pids(net.netns_pids(tb.netns(node)))


def start_sshd(tb: Testbed, node: str) -> None:
    """Start the node's sshd again (after :func:`kill_sshd`)."""
    kill_sshd(tb, node)
    sshd.start(tb.netns(node), tb.node_dir(node))
    sshd.wait_listening(tb.nodes[node])
    if tb.slurm:
        start_slurmd(tb, node)


def set_rate(tb: Testbed, node: str, rate_mbit: float | None) -> None:
    """Limit the node's link to ``rate_mbit`` both ways (tc tbf); ``None`` removes the limit."""
    net.set_rate(tb.prefix, node, tb.index[node], rate_mbit)


def set_fault(tb: Testbed, node: str, faults: Sequence[_Fault | str | dict[str, Any]]) -> None:
    """Replace the node's faults while the test-bed runs: rebuild its data, keys and sshd."""
    parsed = [parse_fault(f, f"{node}[{i}]") for i, f in enumerate(faults)]
    data = _node_data(tb.base, node, parsed, tb.rails)
    tb.faults = FaultPlan(nodes={**tb.faults.nodes, node: parsed})
    kill_sshd(tb, node)
    net.set_link(tb.prefix, node, tb.nodes[node], up=True)
    net.set_rate(tb.prefix, node, tb.index[node], None)
    for rail in range(tb.rails):
        net.set_rail_rate(tb.prefix, tb.index[node], node, rail, None)
    _prepare_node(tb, node, data, tb.identity_file.with_name("id_ed25519.pub").read_text().strip())
    _write_known_hosts(tb)
    _start_node(tb, node)
    if tb.slurm and not {"down", "off"} & {f.kind for f in parsed}:
        start_slurmd(tb, node)
    tb.save()
