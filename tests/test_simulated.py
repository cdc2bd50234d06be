"""The simulated transport (scale work): batches answered in-process from a recording of real test-bed nodes,
command by command through the typed session, so the real checks judge simulated nodes as they judge real
ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster_accept.checks.base import Status, discover
from cluster_accept.checks.samples import SampleKind
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Profile
from cluster_accept.probes.base import discover as discover_probes
from cluster_accept.remote.result import RemoteCommand
from cluster_accept.rundir.run import refuse_unresolved_auto
from cluster_accept.simulator.nodes import (
    NODE_TOKEN,
    Answer,
    Recording,
    SimulatedNode,
    SimulatedSession,
    scale_figures,
)
from cluster_accept.tasks.preflight.check_batch import run_preflight_on_node
from cluster_accept.tasks.preflight.stage import evaluate_preflight
from tests.capture import NO_CLUSTER

RECORDING = Path(__file__).resolve().parent.parent / "bench" / "sim" / "testbed-h200x4.json"


def test_a_recording_keeps_faulty_answers_that_differ_and_names_the_answering_node(tmp_path: Path) -> None:
    recording = Recording()
    recording.add("healthy", "node01", "hostname", Answer(0, "node01\n"))
    recording.add("healthy", "node01", "cat v", Answer(0, "580.159.04\n"))
    recording.add("old", "node07", "hostname", Answer(0, "node07\n"))  # the same once the name is a token
    recording.add("old", "node07", "cat v", Answer(0, "570.86.15\n"))
    assert recording.variants == {
        "healthy": {"hostname": Answer(0, f"{NODE_TOKEN}\n"), "cat v": Answer(0, "580.159.04\n")},
        "old": {"cat v": Answer(0, "570.86.15\n")},
    }
    recording.save(tmp_path / "r.json")
    loaded = Recording.load(tmp_path / "r.json")
    assert loaded.variants == recording.variants
    session = SimulatedSession(SimulatedNode("gpu-0042", "old"), loaded)
    commands = [RemoteCommand("h", "hostname"), RemoteCommand("v", "cat v", {"A": "b"}), RemoteCommand("x", "lspci")]
    batch = session.run_batch(commands, 9.0)
    results = batch.commands
    assert [r.name for r in results] == ["h", "v", "x"] and batch.detail == ""
    assert [(r.exit_code, r.stdout) for r in results] == [(0, "gpu-0042\n"), (0, "570.86.15\n"), (127, "")]
    assert "no recorded answer to 'lspci'" in results[2].stderr  # never a silent pass


def test_a_check_command_the_recording_lacks_is_answered_from_the_checks_healthy_sample() -> None:
    """A check added (or its command changed) since the recording was taken still runs on simulated nodes: its
    own healthy sample answers, and the check passes; a recorded answer wins, and a command that is no check's
    stays unanswered."""
    recording = Recording()
    recording.add("healthy", "node01", "nvidia-smi --query-gpu=driver_version", Answer(0, "570.86.15\n"))
    session = SimulatedSession(SimulatedNode("gpu-0042"), recording)
    commands = [
        RemoteCommand("driver", "nvidia-smi --query-gpu=driver_version"),  # recorded
        RemoteCommand("gpu_count", "nvidia-smi --query-gpu=index,name,a_new_field"),  # not recorded: its sample
        RemoteCommand("x", "lspci"),  # no check's command: unanswered
    ]
    recorded, sampled, unknown = session.run_batch(commands, 9.0).commands
    assert (recorded.exit_code, recorded.stdout) == (0, "570.86.15\n")
    gpu_count = next(c for c in discover() if c.name == "gpu_count")
    healthy = next(s for s in gpu_count.samples if s.kind is SampleKind.HEALTHY)
    assert (sampled.exit_code, sampled.stdout) == (healthy.exit_code, healthy.output())
    assert {r.status for r in gpu_count.evaluate(gpu_count.parse(sampled.stdout, 0), Profile(), NO_CLUSTER)} == {
        Status.PASS
    }
    assert unknown.exit_code == 127 and "no recorded answer to 'lspci'" in unknown.stderr


def test_a_probe_run_the_recording_lacks_is_answered_from_its_probes_healthy_sample_and_said_so() -> None:
    """A probe's node-side run arrives under its script's name: a new probe (or a changed run) is answered from
    the healthy sample of the probe owning the run, and the batch says which commands came from samples."""
    session = SimulatedSession(SimulatedNode("gpu-0042", "slow"), Recording())
    for probe in discover_probes():
        owner = next(p for p in discover_probes() if p.script.name == probe.script.name and p.name == p.script.owner)
        batch = session.run_batch([RemoteCommand(probe.script.name, f"python3 {probe.script.name}.py --new")], 9.0)
        (run,) = batch.commands
        healthy = next((s for s in owner.samples if s.kind is SampleKind.HEALTHY), None) or next(
            s for p in discover_probes() if p.script.name == probe.script.name for s in p.samples
        )
        assert run.exit_code == healthy.exit_code and run.exit_code != 127, probe.name
        assert batch.detail == f"answered from samples (not recorded): {probe.script.name}", probe.name
    recorded = SimulatedSession(SimulatedNode("gpu-0042"), RECORDING_OF_ONE).run_batch(
        [RemoteCommand("h", "hostname")], 9.0
    )
    assert recorded.detail == ""


RECORDING_OF_ONE = Recording({"healthy": {"hostname": Answer(0, "gpu-0042\n")}})


def test_a_faulty_variant_is_never_answered_from_a_healthy_sample() -> None:
    """A faulty node's fault may be recorded under a command's old text: a command it lacks is unanswered (exit
    127, saying so), never the healthy sample, so the fault cannot vanish behind a pass."""
    recording = Recording()
    recording.add("healthy", "node01", "nvidia-smi -L", Answer(0, "GPU 0: H200\n"))
    recording.add("gpu_missing", "node01", "nvidia-smi -L", Answer(0, ""))  # its fault, under the old text
    session = SimulatedSession(SimulatedNode("gpu-0042", "gpu_missing"), recording)
    batch = session.run_batch([RemoteCommand("gpu_count", "nvidia-smi --query-gpu=index,name,a_new_field")], 9.0)
    (run,) = batch.commands
    assert run.exit_code == 127 and "variant 'gpu_missing'" in run.stderr and batch.detail == ""


def test_figures_scale_and_everything_else_is_kept() -> None:
    line = json.dumps({"probe": "gemm", "metric": "gemm_bf16_tflops", "value": 600.0, "size": 8192, "gpu": 0})
    scaled = scale_figures(f"start\n{line}\nnot json {{\n", 0.5).split("\n")
    assert scaled[0] == "start" and scaled[2] == "not json {"
    assert json.loads(scaled[1]) == {
        "probe": "gemm",
        "metric": "gemm_bf16_tflops",
        "value": 300.0,
        "size": 8192,
        "gpu": 0,
    }


def _inventory(tmp_path: Path, faults: str = "") -> Path:
    path = tmp_path / "sim.yaml"
    path.write_text(
        "cluster: sim\ndefaults: {profile: testbed-h200x4}\nnodes:\n  - hosts: gpu[0001-0012]\n"
        f"simulation:\n  recording: {RECORDING}\n  latency_ms: 0\n  faults: {{{faults}}}\n"
        f"profiles:\n  testbed-h200x4:\n{_testbed_profile()}"
    )
    return path


def _testbed_profile() -> str:
    """The profile the recording was made against (the test-bed's), indented under ``profiles``."""
    import yaml

    from cluster_accept.testbed.profile import base_profile

    python = Recording.load(RECORDING).python  # the interpreter is part of the recorded commands' text
    text = yaml.safe_dump(base_profile("h200x4", python=python))
    return "".join(f"    {line}\n" for line in text.splitlines())


def test_simulated_nodes_are_judged_by_the_real_checks(tmp_path: Path) -> None:
    inventory = load_inventory(
        _inventory(tmp_path, "gpu0002: gpu_missing, gpu0003: driver_version, gpu0004: nvlink_inactive")
    )
    checks = discover()
    outcomes = [run_preflight_on_node(node, checks) for node in inventory.tested[:5]]
    rows = evaluate_preflight("sim", inventory, outcomes, checks)
    bad = {(r.node, f"{r.check}:{r.reason}") for r in rows if r.status in (Status.FAIL, Status.ERROR)}
    assert {node for node, _ in bad} == {"gpu0002", "gpu0003", "gpu0004"}, bad
    assert ("gpu0002", "gpu_count:count_low") in bad and ("gpu0003", "driver:version_mismatch") in bad
    assert any(node == "gpu0004" and code.startswith("nvlink:") for node, code in bad)
    healthy = [{(r.check, r.item, r.status, r.reason) for r in rows if r.node == n} for n in ("gpu0001", "gpu0005")]
    assert healthy[0] and healthy[0] == healthy[1]  # two healthy nodes, judged alike


@pytest.mark.parametrize(
    ("faults", "said"),
    [
        ("gpu0002: melted", "'melted' is not a variant of the recording"),
        ("gpu0099: gpu_missing", "not in the inventory: gpu0099"),
    ],
)
def test_a_simulation_the_recording_cannot_answer_is_refused(tmp_path: Path, faults: str, said: str) -> None:
    with pytest.raises(InventoryError, match=said):
        load_inventory(_inventory(tmp_path, faults))


def test_a_missing_recording_and_stages_it_cannot_answer_are_refused(tmp_path: Path) -> None:
    path = _inventory(tmp_path)
    path.write_text(path.read_text().replace(str(RECORDING), "nowhere.json"))
    with pytest.raises(InventoryError, match="not a readable recording"):
        load_inventory(path)
    inventory = load_inventory(_inventory(tmp_path))
    refuse_unresolved_auto(inventory, ["preflight", "single-node", "multi-node"])
    with pytest.raises(ValueError, match="answers preflight, single-node, multi-node, bisect only, not burn"):
        refuse_unresolved_auto(inventory, ["preflight", "burn"])


def test_slow_simulated_nodes_measured_again_together_keep_their_confirmed_straggler_rows(tmp_path: Path) -> None:
    """Several stragglers re-measured (nodes that run the same probes again are judged together): each slow
    node's straggler rows stay as judged, confirmed on its own new figures; no healthy node has one."""
    from cluster_accept.flows.progress import Silent
    from cluster_accept.rundir.checkpoints import Checkpoints
    from cluster_accept.rundir.outputs import RunDir
    from cluster_accept.tasks.probe_runs import judge_nodes, run_probes_on_node
    from cluster_accept.tasks.probe_stage import confirm_stragglers
    from cluster_accept.tasks.single_node import STAGE as SINGLE_NODE
    from cluster_accept.tasks.stage import RunState

    path = _inventory(tmp_path, "gpu0003: slow, gpu0007: slow")
    text = path.read_text()
    path.write_text(text.replace("straggler_pct: 90", "straggler_pct: 25"))  # slow: figures halved
    assert path.read_text() != text
    inventory = load_inventory(path)
    probes = SINGLE_NODE.probes()
    outcomes = [run_probes_on_node(node, False, probes) for node in inventory.tested]
    figures = judge_nodes("sim", inventory, outcomes, False, probes)
    rows = figures.rows
    run_dir = RunDir(tmp_path / "runs", "sim-run")
    run_dir.path.mkdir(parents=True)
    state = RunState(run_dir, inventory, Checkpoints(run_dir.path), Silent())

    judged = confirm_stragglers(state, probes, figures)

    stragglers = [(before, after) for before, after in zip(rows, judged, strict=True) if after.reason == "straggler"]
    assert {r.node for _, r in stragglers} == {"gpu0003", "gpu0007"}, [(r.node, r.item) for _, r in stragglers]
    for before, after in stragglers:  # kept as judged (a warning under this profile's relative_verdict), confirmed
        assert after.status is before.status and "still below" in after.detail, after.detail
        assert after.detail.startswith(before.detail) and after.detail.endswith(": confirmed"), after.detail
    assert not [r for r in judged if r.reason == "straggler_unconfirmed"]
