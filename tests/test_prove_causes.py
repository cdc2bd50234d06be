"""The stage's step that proves a suspect: which nodes it measures again, with what removed, and the rows it
writes from the figures that came back (the node's runs stood in by functions: no node, no process)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cluster_accept.analysis.probe_verdicts import measurement_frame
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.inventory.model import Node, Profile, SshSettings
from cluster_accept.probes.gemm import PROBE as GEMM
from cluster_accept.probes.scripts import REMOVED_SETTINGS
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.tasks.prove_causes import prove_causes
from cluster_accept.tasks.stage import RunState
from cluster_accept.vocabulary.rows import Measurement

SETTINGS = "\n".join(  # what job_settings.py printed on the run's stderr, one line per setting
    json.dumps({"info": "settings", "setting": entry})
    for entry in (
        {"name": "NCCL_MAX_NCHANNELS", "value": "1", "source": "/etc/nccl.conf"},
        {"name": "OMP_NUM_THREADS", "value": "4", "source": "env"},
    )
)


def _state(prove: bool) -> RunState:
    profile = Profile.model_validate({"thresholds": {"gemm_bf16_tflops_min": 600}, "probes": {"prove_causes": prove}})
    nodes = {name: Node(name, SshSettings(), "p", profile) for name in ("n1", "n2")}
    inventory = SimpleNamespace(node=nodes.__getitem__, nodes=list(nodes.values()), tested=list(nodes.values()))
    return cast(RunState, SimpleNamespace(inventory=inventory, quick=False, run_id="r", cluster="c"))


def _figure(node: str, value: float) -> Measurement:
    return Measurement(
        run_id="r",
        cluster="c",
        stage="single-node",
        node=node,
        metric="gemm_bf16_tflops",
        value=value,
        profile="p",
        gpu=0,
        unit="TFLOP/s",
    )


def _outcome(node: str, settings: str) -> NodeResult:
    return NodeResult(node, NodeStatus.OK, commands=[CommandResult("gpu_bench", 0, "", settings)])


def _failing() -> list[NodeRow]:
    row = NodeRow("r", "c", "single-node", "n1", "gemm", "gemm_bf16_tflops", Status.FAIL, "below_threshold", "300",
                  ">= 600 TFLOP/s", "", gpu=0)  # fmt: skip
    return [row]


def test_a_failed_figure_is_measured_again_without_the_suspects_and_the_recovery_confirms_them() -> None:
    removed: list[dict[str, Any]] = []

    def measure(node: Node, quick: bool, probes: Any) -> NodeResult:
        removed.append(dict(REMOVED_SETTINGS.get()))
        return _outcome(node.name, "")

    before = measurement_frame([_figure("n1", 300.0), _figure("n2", 700.0)])
    outcomes = [_outcome("n1", SETTINGS), _outcome("n2", "")]
    proof = prove_causes(
        _state(True),
        "single-node",
        [GEMM],
        outcomes,
        (_failing(), before),
        (measure, lambda o, p, s: [_figure(o.node, 690.0)]),
    )
    # n1 only (n2 passed); NCCL's key set empty (a config file sets it), the environment's unset
    assert removed == [{"NCCL_MAX_NCHANNELS": "", "OMP_NUM_THREADS": None}]
    rows = {(r.check, r.item): r for r in proof.rows}
    # two settings removed at once: each "confirmed_together" (one or more of them), a warning beside the figure
    assert {rows[("job_settings", k)].reason for k in ("NCCL_MAX_NCHANNELS", "OMP_NUM_THREADS")} == {
        "confirmed_together"
    }
    assert "gemm_bf16_tflops gpu 0 300 -> 690.0" in rows[("job_settings", "OMP_NUM_THREADS")].detail
    assert rows[("gemm", "gemm_bf16_tflops")].detail.endswith("690.0, recovered: the setting is the cause")
    assert [(m.node, m.stage, m.value) for m in proof.measurements] == [("n1", "single-node:without-suspects", 690.0)]


@pytest.mark.parametrize("again", [310.0, None])
def test_a_figure_as_low_without_them_clears_them_and_none_back_leaves_them_suspects(again: float | None) -> None:
    before = measurement_frame([_figure("n1", 300.0)])
    figures = [] if again is None else [_figure("n1", again)]
    proof = prove_causes(
        _state(True), "single-node", [GEMM], [_outcome("n1", SETTINGS)], (_failing(), before),
        (lambda n, q, p: _outcome(n.name, ""), lambda o, p, s: figures),
    )  # fmt: skip
    settings = [r for r in proof.rows if r.check == "job_settings"]
    assert {r.reason for r in settings} == ({"cleared"} if again is not None else {"suspect"})


def test_proving_turned_off_names_the_suspects_without_measuring() -> None:
    def measure(node: Node, quick: bool, probes: Any) -> NodeResult:
        raise AssertionError("measured again with probes.prove_causes: false")

    before = measurement_frame([_figure("n1", 300.0)])
    proof = prove_causes(
        _state(False), "single-node", [GEMM], [_outcome("n1", SETTINGS)], (_failing(), before),
        (measure, lambda o, p, s: []),
    )  # fmt: skip
    settings = [r for r in proof.rows if r.check == "job_settings"]
    assert [(r.item, r.status) for r in settings] == [
        ("NCCL_MAX_NCHANNELS", Status.WARN),
        ("OMP_NUM_THREADS", Status.WARN),
    ]
    assert all("probes.prove_causes: false" in r.detail for r in settings) and not proof.measurements


def test_a_setting_only_nccls_log_names_is_a_suspect_too() -> None:
    """A file the run could not read (inside a container, a launcher's own) still shows in NCCL's account: what NCCL
    says it took is a setting of the run, set empty when the run is measured again."""
    from cluster_accept.analysis.nccl_account import SETTING
    from cluster_accept.tasks.prove_causes import NCCL_LOG, node_settings
    from cluster_accept.vocabulary.rows import NcclFact

    facts = [
        NcclFact("r", "c", "single-node", "n1", "allreduce", SETTING, "NCCL_MAX_NCHANNELS", "1"),
        NcclFact("r", "c", "single-node", "n1", "allreduce", SETTING, "OMP_NUM_THREADS", "8"),  # the run named it
        NcclFact("r", "c", "single-node", "n2", "allreduce", SETTING, "NCCL_ALGO", "Tree"),  # another node's
    ]
    outcome = NodeResult("n1", NodeStatus.OK, commands=[CommandResult("allreduce", 0, "", SETTINGS)])
    found = {s.key: s for s in node_settings(outcome, frozenset({"allreduce"}), facts)}
    assert set(found) == {"NCCL_MAX_NCHANNELS", "OMP_NUM_THREADS"}
    assert found["NCCL_MAX_NCHANNELS"].source == "/etc/nccl.conf"  # the run's own account first
    only_log = node_settings(NodeResult("n1", NodeStatus.OK), frozenset({"allreduce"}), facts)
    assert [(s.key, s.source, s.removal()) for s in only_log] == [
        ("NCCL_MAX_NCHANNELS", NCCL_LOG, ""),
        ("OMP_NUM_THREADS", NCCL_LOG, ""),  # read from a file NCCL read: set empty, or NCCL sets it back
    ]


def test_a_figure_the_probe_judges_off_its_own_output_is_proved_against_the_minimum_its_row_states() -> None:
    """The data-parallel efficiency is judged by the training probe off its run (not one of its cluster metrics):
    CUDA_DEVICE_MAX_CONNECTIONS=1 costs DDP its overlap; measured again without it the efficiency is back."""
    from cluster_accept.probes.training import PROBE as TRAINING

    settings = json.dumps(
        {"info": "settings", "setting": {"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1", "source": "env"}}
    )
    row = NodeRow("r", "c", "single-node", "n1", "training", "training_dp_efficiency", Status.FAIL,
                  "dp_efficiency_low", "0.648 (100,222 together / 154,600 solo tokens/s per GPU)",
                  ">= 0.80 of the node's slowest GPU's solo tokens/s (default …)", "")  # fmt: skip

    def figure(value: float) -> Measurement:
        return Measurement(
            run_id="r",
            cluster="c",
            stage="single-node",
            node="n1",
            metric="training_dp_efficiency",
            value=value,
            profile="p",
            unit="ratio",
        )

    before = measurement_frame([figure(0.648)])
    outcome = NodeResult("n1", NodeStatus.OK, commands=[CommandResult("training", 0, "", settings)])
    proof = prove_causes(
        _state(True), "single-node", [TRAINING], [outcome], ([row], before),
        (lambda n, q, p: _outcome(n.name, ""), lambda o, p, s: [figure(0.904)]),
    )  # fmt: skip
    proved = [r for r in proof.rows if r.check == "job_settings"]
    assert [(r.item, r.reason) for r in proved] == [("CUDA_DEVICE_MAX_CONNECTIONS", "confirmed")]
    assert (
        "training_dp_efficiency 0.648 (100,222 together / 154,600 solo tokens/s per GPU) -> 0.904" in proved[0].detail
    )


def test_a_rank_across_nodes_runs_without_its_own_nodes_suspects_only() -> None:
    """Between nodes each rank's command is built without that node's suspects, in the call that builds it (the
    launcher's threads see no setting of another's), and says its settings on stdout first."""
    from cluster_accept.tasks.multi_node.prove import without
    from cluster_accept.tasks.multi_node.ranks import ALLREDUCE_JOB

    profile = Profile.model_validate({"probes": {"device": "cpu"}})
    one, two = (Node(name, SshSettings(), "p", profile) for name in ("n1", "n2"))
    job = without(ALLREDUCE_JOB, {"n2": {"NCCL_MAX_NCHANNELS": None, "NCCL_PROTO": "^"}})
    first = job.command(one, 0, 2, "10.0.0.1", 29500, "tag").script
    second = job.command(two, 1, 2, "10.0.0.1", 29500, "tag").script
    assert "-u NCCL_MAX_NCHANNELS" not in first and "NCCL_PROTO" not in first
    assert "env -u NCCL_MAX_NCHANNELS NCCL_PROTO='^' NCCL_DEBUG=INFO " in second
    assert second.startswith('( cd "$CA_PROBE_DIR" && python3 job_settings.py ) 2>/dev/null; ')
    assert REMOVED_SETTINGS.get() == {}  # nothing left set after the command was built
