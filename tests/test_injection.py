"""No shell injection through the inventory or node output: the real command lines, executed by bash.

Every value that reaches a node-side command line is set to a hostile string, the code that builds the
command runs for real (probe commands, the multi-node rank command, the free-port probe, the batch script,
``SshSession.run_script``'s ``sh -c`` wrapping, the probe directory's mktemp/rm), and what would be sent to
the node is executed by ``bash -c`` in a sandbox where ``python3``, ``nvidia-smi`` and ``timeout`` are
harmless stand-ins. A stand-in records its argv and environment, so each test also proves that the hostile
value arrived as one intact word. ``probes.command_prefix`` is left out on purpose: it is the operator's own
shell (``docker exec trainer``), pasted in front of the probe as written.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

import cluster_accept.remote.ssh
from cluster_accept.checks.base import discover
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import DEFAULT_SSH, Node, ProbeSettings, Profile
from cluster_accept.remote.result import NodeStatus, RemoteCommand
from cluster_accept.remote.ssh import SshSession
from cluster_accept.reports.actions import reproduce
from cluster_accept.tasks.launcher import launch_group
from cluster_accept.tasks.preflight import run_preflight_on_node
from cluster_accept.tasks.probe_dir import run_in_probe_dir
from cluster_accept.tasks.single_node import probe_commands, run_probes_on_node

pytestmark = pytest.mark.pure

HOSTILE = [
    "$(touch {m})",
    "`touch {m}`",
    "; touch {m}",
    "' ; touch {m} ; '",
    '" ; touch {m} ; "',
    "x\ntouch {m}",
    "x && touch {m}",
    "x | touch {m}",
]
STANDINS = {
    "timeout": '#!/bin/sh\nif [ "$1" = -k ]; then shift 2; fi\nshift\nexec "$@"\n',  # run it, no time limit
    "nvidia-smi": "#!/bin/sh\necho 'GPU 0: Stand-in (UUID: GPU-0)'\necho 'GPU 1: Stand-in (UUID: GPU-1)'\n",
}
ENV_SEEN = ("CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME", "CA_PROBE_DIR", "NCCL_DEBUG")


@dataclass
class Record:
    argv: list[str]
    env: dict[str, str]
    cwd: str


@dataclass
class Sandbox:
    """A directory standing in for a node: stand-ins first on PATH, a private TMPDIR, and the marker file that
    any injected ``touch`` would create."""

    root: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    answers: Callable[[str], tuple[int, str, str] | None] = lambda command_line: None
    command_lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("bin", "tmp", "home", "records", "marker"):
            (self.root / name).mkdir()
        for name, text in STANDINS.items():
            self.executable(str(self.root / "bin" / name), text)
        self.executable(str(self.root / "bin" / "python3"), self.recorder())

    @property
    def marker(self) -> Path:
        return self.root / "marker" / "pwned"

    def hostile(self, template: str) -> str:
        return template.format(m=self.marker)

    def recorder(self) -> str:
        """A program that writes its argv, environment and working directory to a record, then prints a port."""
        records = shlex.quote(str(self.root / "records"))
        seen = " ".join(f'"{name}=${{{name}-}}"' for name in ENV_SEEN)
        return (
            "#!/bin/sh\n"
            f"f=$(mktemp {records}/rec.XXXXXXXX)\n"
            "{ printf '%s\\0' \"$0\" \"$@\"; printf '\\036\\0'; "
            f'printf \'%s\\0\' {seen} "PWD=$(pwd)"; }} > "$f"\n'
            "echo 12345\n"
        )

    @staticmethod
    def executable(path: str, text: str) -> str:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_text(text)
        os.chmod(path, 0o755)
        return path

    def records(self) -> list[Record]:
        found = []
        for path in sorted((self.root / "records").iterdir()):
            parts = path.read_bytes().decode().split("\0")
            split = parts.index("\x1e")
            env = dict(p.split("=", 1) for p in parts[split + 1 :] if p)
            found.append(Record(parts[:split], env, env.pop("PWD")))
        return found

    def node_shell(self, command_line: str) -> tuple[int, bytes, bytes]:
        """What sshd does with the command line: the login shell runs it with ``-c``."""
        self.command_lines.append(command_line)
        answer = self.answers(command_line)
        if answer is not None:
            code, out, err = answer
            return code, out.encode(), err.encode()
        env = {
            "PATH": f"{self.root / 'bin'}:/usr/bin:/bin",
            "HOME": str(self.root / "home"),
            "TMPDIR": str(self.root / "tmp"),
            "LC_ALL": "C",
            **self.extra_env,
        }
        done = subprocess.run(
            ["bash", "-c", command_line], env=env, cwd=self.root / "home", capture_output=True, timeout=60
        )
        return done.returncode, done.stdout, done.stderr


class FakeChannel:
    """Just enough of a paramiko channel for :meth:`SshSession.run_script`; the command runs in the sandbox."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self.out = self.err = b""
        self.code: int | None = None
        self.eof_received = True
        self.closed = False
        self.status_event = threading.Event()
        self._read, self._write = os.pipe()
        os.write(self._write, b".")  # always readable: select() returns at once

    def fileno(self) -> int:
        return self._read

    def exec_command(self, command_line: str) -> None:
        self.code, self.out, self.err = self.sandbox.node_shell(command_line)
        self.status_event.set()

    def shutdown_write(self) -> None:
        return None

    def recv_ready(self) -> bool:
        return bool(self.out)

    def recv(self, size: int) -> bytes:
        chunk, self.out = self.out[:size], self.out[size:]
        return chunk

    def recv_stderr_ready(self) -> bool:
        return bool(self.err)

    def recv_stderr(self, size: int) -> bytes:
        chunk, self.err = self.err[:size], self.err[size:]
        return chunk

    def exit_status_ready(self) -> bool:
        return self.status_event.is_set()

    def recv_exit_status(self) -> int | None:
        return self.code

    def close(self) -> None:
        if not self.closed:
            os.close(self._read)
            os.close(self._write)
            self.closed = True


class FakeTransport:
    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float | None = None) -> FakeChannel:
        return FakeChannel(self.sandbox)


class FakeConnection:
    """A Fabric connection whose transport runs commands in the sandbox and whose SFTP put is a copy."""

    def __init__(self, sandbox: Sandbox):
        self.transport = FakeTransport(sandbox)

    def put(self, local: str, remote: str) -> None:
        shutil.copyfile(local, remote)

    def close(self) -> None:
        return None


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    box = Sandbox(tmp_path)

    def connect(node: Node) -> SshSession:
        return SshSession(node, FakeConnection(box))  # type: ignore[arg-type]

    for module in ("cluster_accept.tasks.probe_dir", "cluster_accept.tasks.launcher", "cluster_accept.remote.fanout"):
        monkeypatch.setattr(f"{module}.connect", connect)
    return box


def node(name: str = "node01", address: str | None = None, **probes: Any) -> Node:
    nccl_env = probes.pop("nccl_env", {})
    profile = Profile(nccl_env=nccl_env, probes=ProbeSettings(**probes))
    return Node(name=name, ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=address)


@pytest.mark.parametrize("variant", ["cpu", "cuda", "nccl-tests"])
@pytest.mark.parametrize("template", HOSTILE)
def test_single_node_probe_paths_are_one_word(sandbox: Sandbox, template: str, variant: str) -> None:
    hostile = sandbox.hostile(template)
    python = sandbox.executable(f"{sandbox.root}/py/{hostile}", sandbox.recorder())
    settings: dict[str, Any] = {"python": python, "device": "cpu" if variant == "cpu" else "cuda"}
    if variant == "nccl-tests":
        settings["nccl_tests_all_reduce"] = sandbox.executable(f"{sandbox.root}/nccl/{hostile}", sandbox.recorder())
    target = node(**settings)

    outcome = run_probes_on_node(target)

    assert not sandbox.marker.exists()
    assert outcome.status is NodeStatus.OK, outcome.detail
    device = settings["device"]
    torch_run = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "allreduce.py"]
    nccl_tests = [settings.get("nccl_tests_all_reduce"), "-b", "1M", "-e", str(1 << 30), "-f", "4", "-g", "2"]
    expected = [
        [python, "gpu_bench.py", "--device", device],
        nccl_tests if variant == "nccl-tests" else [*torch_run, "--device", device],
    ]
    records = sandbox.records()
    assert sorted(r.argv for r in records) == sorted(expected)
    probe_dir = records[0].env["CA_PROBE_DIR"]
    assert Path(probe_dir).parent == sandbox.root / "tmp" and Path(probe_dir).name.startswith("cluster-accept-probe.")
    assert records[0].cwd == probe_dir or records[1].cwd == probe_dir
    assert not Path(probe_dir).exists()  # removed after the stage


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("template", HOSTILE)
def test_multi_node_rank_command_and_free_port_probe(sandbox: Sandbox, template: str, device: str) -> None:
    hostile = sandbox.hostile(template)
    python = sandbox.executable(f"{sandbox.root}/py/{hostile}", sandbox.recorder())
    if device == "cpu":
        settings: dict[str, Any] = {"nccl_env": {"NCCL_SOCKET_IFNAME": hostile}}
    else:
        settings = {"cuda_visible_devices": hostile}
    # The loader refuses such an address (test_hostile_inventory_values_are_refused); the command line must be
    # safe without that.
    nodes = [node(f"node0{i}", address=hostile, python=python, device=device, **settings) for i in (1, 2)]

    launch_group(nodes, tag="cas9tag")

    assert not sandbox.marker.exists()
    sizes = ["--max-bytes", str(1 << 20), "--repeats", "2"] if device == "cpu" else ["--max-bytes", str(1 << 30)]
    expected = [[python, "-c", 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])']]
    for rank in (0, 1):
        expected.append(
            [python, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", f"--node_rank={rank}"]
            + [f"--master_addr={hostile}", "--master_port=12345", "allreduce.py", "--device", device]
            + ["--label", "inter_node", "--tag", "cas9tag", "--min-bytes", str(1 << 20), *sizes]
        )
    records = sandbox.records()
    assert sorted(r.argv for r in records) == sorted(expected)
    ranks = [r for r in records if "--nnodes=2" in r.argv]
    variable = "GLOO_SOCKET_IFNAME" if device == "cpu" else "CUDA_VISIBLE_DEVICES"
    assert [r.env[variable] for r in ranks] == [hostile, hostile]
    assert all(r.env["NCCL_DEBUG"] == "INFO" for r in ranks)


@pytest.mark.parametrize("where", ["NCCL_CONF_FILE", "HOME"])
@pytest.mark.parametrize("template", HOSTILE)
def test_nccl_env_check_reads_a_hostile_node_environment_as_data(sandbox: Sandbox, template: str, where: str) -> None:
    hostile = sandbox.hostile(template)
    conf_dir = Path(f"{sandbox.root}/conf/{hostile}")
    conf_dir.mkdir(parents=True)
    conf = conf_dir / ".nccl.conf"
    conf.write_text(f"NCCL_FROM_FILE={hostile}\n{hostile}\nNCCL_API_TOKEN={hostile}\n")
    sandbox.extra_env = {"NCCL_HOSTILE": hostile, "NCCL_IB_SECRET_TOKEN": hostile}
    sandbox.extra_env.update({"NCCL_CONF_FILE": str(conf)} if where == "NCCL_CONF_FILE" else {"HOME": str(conf_dir)})
    check = next(c for c in discover() if c.name == "nccl_env")

    outcome = run_preflight_on_node(node(), [check])

    assert not sandbox.marker.exists()
    model = outcome.models["nccl_env"]
    assert model.error is None
    first_line = hostile.split("\n")[0]  # `env` prints a value with a newline as two lines
    assert model.effective["NCCL_HOSTILE"].value == first_line
    assert model.effective["NCCL_FROM_FILE"].value == first_line
    assert model.effective["NCCL_IB_SECRET_TOKEN"].value == "****"
    assert model.effective["NCCL_API_TOKEN"].value == "****"


MKTEMP_OUTPUTS = [
    "/tmp/cluster-accept-probe.x; touch {m}",
    "/tmp/$(touch {m})/cluster-accept-probe.x",
    "/tmp/cluster-accept-probe.`touch {m}`",
    "/tmp/cluster-accept-probe.x' ; touch {m} ; '",
    "/tmp/cluster-accept-probe.x && touch {m}",
    "-rf /tmp/cluster-accept-probe.x",
    "/tmp/cluster-accept-probe.x\n/tmp/cluster-accept-probe.y | touch {m}",
]


@pytest.mark.parametrize("template", MKTEMP_OUTPUTS)
def test_hostile_mktemp_output_is_refused_before_any_command(sandbox: Sandbox, template: str) -> None:
    sandbox.answers = lambda line: (0, sandbox.hostile(template) + "\n", "") if "mktemp -d" in line else None

    run = run_in_probe_dir(node(), ("gpu_bench.py",), [RemoteCommand("x", "true")])

    assert (run.status, run.results) == (NodeStatus.ERROR, [])
    assert "mktemp failed" in run.detail
    assert len(sandbox.command_lines) == 1  # no copy, no batch, no rm -rf of a path the node made up
    assert not sandbox.marker.exists()


@pytest.mark.parametrize("output", ["12345; touch {m}", "$(touch {m})", "`touch {m}`", "12345 && touch {m}"])
def test_hostile_free_port_output_starts_no_rank(sandbox: Sandbox, output: str) -> None:
    sandbox.answers = lambda line: (0, sandbox.hostile(output) + "\n", "") if "getsockname" in line else None

    run = launch_group([node("node01", "10.0.0.1"), node("node02", "10.0.0.2")], tag="cas9tag")

    assert "could not pick a free port" in run.ranks["node01"].detail
    assert len(sandbox.command_lines) == 1 and sandbox.records() == []
    assert not sandbox.marker.exists()


def inventory_file(tmp_path: Path, ssh: dict[str, Any] | None = None, **entry: Any) -> Path:
    data = {
        "cluster": "c",
        "defaults": {"profile": "p", "ssh": {"user": "ops", **(ssh or {})}},
        "nodes": [{"hosts": "node01", **entry}],
        "profiles": {"p": {}},
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("template", [*HOSTILE, "-oProxyCommand=touch {m}", "node01,node02;touch {m}"])
def test_hostile_inventory_values_are_refused(tmp_path: Path, template: str) -> None:
    hostile = template.format(m=tmp_path / "pwned")
    for entry, ssh, key in [
        ({"hosts": hostile}, {}, "nodes[0].hosts"),
        ({"address": hostile}, {}, "nodes[0].address"),
        ({}, {"jump": hostile}, "defaults.ssh.jump"),
        ({}, {"jump": f"root@{hostile}:22"}, "defaults.ssh.jump"),
        ({}, {"port": hostile}, "defaults.ssh.port"),
    ]:
        with pytest.raises(InventoryError) as info:
            load_inventory(inventory_file(tmp_path, ssh, **entry))
        assert key in str(info.value), (entry, ssh)
    assert not (tmp_path / "pwned").exists()


def test_hostile_users_and_paths_are_passed_as_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    """Users, key and known_hosts paths reach paramiko only, never a shell: they load as written, and even the
    operator's ``Match exec`` (which a shell runs, with %h, %r, %n expanded) does not see the user."""
    hostile = sandbox.hostile(HOSTILE[0])
    ssh = {"user": hostile, "identity_file": f"/keys/{hostile}", "known_hosts": f"/kh/{hostile}"}
    inventory = load_inventory(inventory_file(tmp_path, ssh, address="10.0.0.1"))
    target = inventory.node("node01")
    assert (target.ssh.user, target.ssh.identity_file, target.ssh.known_hosts) == tuple(ssh.values())

    expanded = sandbox.root / "match-exec"
    (sandbox.root / "home" / ".ssh").mkdir()
    (sandbox.root / "home" / ".ssh" / "config").write_text(f'Match exec "echo %h %r %n > {expanded}"\n')
    monkeypatch.setenv("HOME", str(sandbox.root / "home"))
    monkeypatch.setattr(cluster_accept.remote.ssh, "_ssh_config", None)
    with open(os.devnull) as no_input:
        monkeypatch.setattr(sys, "stdin", no_input)  # invoke, running Match exec, reads stdin
        connection = cluster_accept.remote.ssh._connection(target.connect_host, target.ssh)
    assert (connection.host, connection.user) == ("10.0.0.1", hostile)
    assert "10.0.0.1" in expanded.read_text() and "touch" not in expanded.read_text()
    assert not sandbox.marker.exists()


@pytest.mark.parametrize("template", HOSTILE)
def test_reproduce_lines_quote_the_inventory_path(sandbox: Sandbox, template: str) -> None:
    hostile = sandbox.hostile(template)
    for name in ("ssh", "cluster-accept"):
        sandbox.executable(str(sandbox.root / "bin" / name), "#!/bin/sh\nexit 0\n")
    target = node(device="cpu")
    rows = [
        {"node": "node01", "stage": "preflight", "status": "fail", "command": "nvidia-smi -L"},
        {"node": "node01", "stage": "single-node", "status": "fail", "command": probe_commands(target)[0].script},
        {"node": "node01", "stage": "multi-node", "status": "fail", "command": ""},
        {"node": "node01", "stage": "preflight", "status": "unreachable", "command": ""},
    ]
    for row in rows:
        lines = reproduce(row, f"/inventories/{hostile}.yaml", good_node="node02")
        code, _, err = sandbox.node_shell("\n".join(lines))
        assert code == 0, (lines, err)
    assert not sandbox.marker.exists()


def test_reproduce_line_of_a_probe_with_a_newline_in_its_path(sandbox: Sandbox) -> None:
    target = node(python=f"python3\ntouch {sandbox.marker} #", device="cpu")
    row = {"node": "node01", "stage": "single-node", "status": "fail", "command": probe_commands(target)[0].script}
    sandbox.executable(str(sandbox.root / "bin" / "cluster-accept"), "#!/bin/sh\nexit 0\n")
    sandbox.node_shell("\n".join(reproduce(row, "inventory.yaml")))
    assert not sandbox.marker.exists()
