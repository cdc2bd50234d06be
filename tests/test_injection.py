"""No shell injection through the inventory or node output: the real command lines, executed by bash.

Every value that reaches a node-side command line is set to a hostile string, the code that builds the
command runs for real (probe commands, the multi-node rank command, the free-port probe, the batch script,
``SshSession.run_script``'s ``sh -c`` wrapping, the probe directory's mktemp/rm), and what would be sent to
the node is executed by ``bash -c`` in a sandbox where ``python3``, ``nvidia-smi`` and ``timeout`` are
harmless stand-ins. A stand-in records its argv and environment, so each test also proves that the hostile
value arrived as one intact word. ``probes.command_prefix`` is left out on purpose: it is the operator's own
shell (``docker exec trainer``), pasted in front of the probe as written. The sandbox is in
injection_sandbox.py; values of the inventory itself are in test_injection_inventory.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster_accept.checks.base import discover
from cluster_accept.probes.scripts import LOOPBACK_PORT
from cluster_accept.probes.training import train_arguments
from cluster_accept.remote.probe_dir import run_in_probe_dir
from cluster_accept.remote.result import NodeStatus, RemoteCommand
from cluster_accept.tasks.multi_node.ranks import launch_group
from cluster_accept.tasks.preflight.check_batch import run_preflight_on_node
from cluster_accept.tasks.probe_runs import run_probes_on_node
from tests.injection_sandbox import HOSTILE, Sandbox, install_sandbox, node


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    return install_sandbox(tmp_path, monkeypatch)


@pytest.mark.integration
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
    torch_run = [python, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2"]
    torch_run += ["--master_addr=127.0.0.1", "--master_port=12345", "--rdzv-conf=timeout=120", "allreduce.py"]
    nccl_tests = [settings.get("nccl_tests_all_reduce"), "-b", "1M", "-e", str(1 << 30), "-f", "4", "-g", "2"]
    expected = [[python, "gpu_bench.py", "--device", device]]
    if variant == "nccl-tests":
        expected.append(nccl_tests)
    else:  # a free loopback port first, from the probe's own interpreter
        ops = "all_reduce,all_gather,reduce_scatter,all_to_all"  # the profile's default collectives
        expected += [
            [python, "-c", LOOPBACK_PORT],
            [*torch_run, "--device", device, "--ops", ops, "--init-timeout-s", "120"],
        ]
    if device == "cuda":
        expected.append([python, "gpu_pairs.py"])  # the GPU-pair matrix, on CUDA profiles only
    trainer = [python, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={1 if device == 'cpu' else 2}"]
    trainer += ["--master_addr=127.0.0.1", "--master_port=12345", "--rdzv-conf=timeout=120", "train_step.py"]
    trainer += [*train_arguments(target, False).split(), "--label", "intra_node", "--init-timeout-s", "120"]
    expected += [[python, "-c", LOOPBACK_PORT], trainer]
    # before each run, the settings it runs with: the GPU bench, the sweep, training (and the pairs on CUDA)
    expected += [[python, "job_settings.py"]] * (4 if device == "cuda" else 3)
    records = sandbox.records()
    assert sorted(r.argv for r in records) == sorted(expected)
    probe_dir = records[0].env["CA_PROBE_DIR"]
    assert Path(probe_dir).parent == sandbox.root / "tmp" and Path(probe_dir).name.startswith("cluster-accept-probe.")
    assert records[0].cwd == probe_dir or records[1].cwd == probe_dir
    assert not Path(probe_dir).exists()  # removed after the stage


@pytest.mark.integration
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
    expected = [[python, "-I", "-c", 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])']]
    for rank in (0, 1):
        expected.append(
            [python, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", f"--node_rank={rank}"]
            + [f"--master_addr={hostile}", "--master_port=12345", "--rdzv-conf=timeout=120", "allreduce.py"]
            + ["--device", device, "--label", "inter_node", "--tag", "cas9tag", "--min-bytes", str(1 << 20), *sizes]
            + ["--init-timeout-s", "120"]
        )
        expected.append([python, "job_settings.py"])  # before each rank, the settings it runs with
    records = sandbox.records()
    assert sorted(r.argv for r in records) == sorted(expected)
    ranks = [r for r in records if "--nnodes=2" in r.argv]
    variable = "GLOO_SOCKET_IFNAME" if device == "cpu" else "CUDA_VISIBLE_DEVICES"
    assert [r.env[variable] for r in ranks] == [hostile, hostile]
    assert all(r.env["NCCL_DEBUG"] == "INFO" for r in ranks)


@pytest.mark.integration
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

    assert (run.status, run.commands) == (NodeStatus.ERROR, [])
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
