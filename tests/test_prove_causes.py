"""The stage's step that proves a suspect: which nodes it measures again, with what removed, and the rows it
writes from the figures that came back (the node's runs stood in by functions: no node, no process)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import pandas as pd
import pytest

from cluster_accept.analysis.probe_verdicts import measurement_frame
from cluster_accept.analysis.proof import position, row_call
from cluster_accept.analysis.suspects import Retest
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


def _lines(settings: Mapping[str, tuple[str, str]]) -> str:
    """job_settings.py's lines for ``settings`` (name -> (value, source))."""
    return "\n".join(
        json.dumps({"info": "settings", "setting": {"name": k, "value": v, "source": src}})
        for k, (v, src) in settings.items()
    )


class NodeModel:
    """A node below the SSH line: its run's settings (the failing run's, with what an arm reverts set back), and
    a GEMM figure of 700 slowed by each culprit still in effect (a pair: only both together). Each arm's settings
    and figure come back as the node would print them."""

    def __init__(
        self,
        settings: Mapping[str, tuple[str, str]],
        culprits: Mapping[str, float],
        pairs: Sequence[tuple[str, str, float]] = (),
    ) -> None:
        self.settings, self.culprits, self.pairs = dict(settings), dict(culprits), list(pairs)
        self.arms: list[dict[str, str | None]] = []

    def in_effect(self, reverted: Mapping[str, str | None]) -> dict[str, tuple[str, str]]:
        now = {k: v for k, v in self.settings.items() if k not in reverted}
        now.update({k: (v, "env") for k, v in reverted.items() if v is not None and v != ""})
        return now

    def figure(self, now: Mapping[str, tuple[str, str]]) -> float:
        """700 slowed by each culprit in effect at the failing run's value."""
        on = {k for k, v in now.items() if self.settings.get(k) == v}
        value = 700.0 * math.prod(f for k, f in self.culprits.items() if k in on)
        return value * math.prod(f for a, b, f in self.pairs if a in on and b in on)

    def measure(self, node: Node, quick: bool, probes: Any) -> NodeResult:
        reverted = dict(REMOVED_SETTINGS.get())
        self.arms.append(reverted)
        now = self.in_effect(reverted)
        return NodeResult(
            node.name, NodeStatus.OK, commands=[CommandResult("gpu_bench", 0, f"{self.figure(now)}", _lines(now))]
        )

    def read(self, outcome: NodeResult, probes: Any, stage: str) -> list[Measurement]:
        return [_figure(outcome.node, float(outcome.commands[0].stdout))]

    def failing_run(self) -> NodeResult:
        return NodeResult("n1", NodeStatus.OK, commands=[CommandResult("gpu_bench", 0, "", _lines(self.settings))])


def _proved(model: NodeModel, state: RunState | None = None) -> tuple[dict[tuple[str, str], NodeRow], Any]:
    before = measurement_frame(
        [_figure("n1", model.figure(model.settings)), _figure("n2", 700.0), _figure("n3", 705.0), _figure("n4", 698.0)]
    )
    failing = [replace(_failing()[0], observed=f"{model.figure(model.settings):g}")]
    proof = prove_causes(
        state or _state(True),
        "single-node",
        [GEMM],
        [model.failing_run()],
        (failing, before),
        (model.measure, model.read),
    )
    return {(r.check, r.item): r for r in proof.rows}, proof


CONTAINER = {f"NCCL_SETTING_{i:02d}": (str(i), "env") for i in range(18)} | {
    "NCCL_MAX_NCHANNELS": ("1", "/etc/nccl.conf"),
    "OMP_NUM_THREADS": ("4", "env"),
}


def test_one_culprit_among_twenty_differences_is_named_alone_and_the_others_cleared() -> None:
    model = NodeModel(CONTAINER, {"NCCL_SETTING_11": 0.2})
    rows, proof = _proved(model)
    named = {k[1]: r.reason for k, r in rows.items() if k[0] == "job_settings" and r.status != Status.PASS}
    assert named == {"NCCL_SETTING_11": "confirmed"}
    assert {r.reason for k, r in rows.items() if k[0] == "job_settings" and k[1] != "NCCL_SETTING_11"} == {"cleared"}
    confirmed = rows[("job_settings", "NCCL_SETTING_11")]
    assert confirmed.status == Status.FAIL and confirmed.expected == "unset"
    assert "kept alone in effect (every other difference reverted) the figure stayed low" in confirmed.detail
    assert f"proved in {len(model.arms)} re-measurements (at most 19)" in confirmed.detail and len(model.arms) <= 12
    # the first arm reverted all 20: NCCL's file key set empty (NCCL never overwrites the environment's), others unset
    assert model.arms[0]["NCCL_MAX_NCHANNELS"] == "" and model.arms[0]["OMP_NUM_THREADS"] is None
    note = rows[("gemm", "gemm_bf16_tflops")].detail
    assert "the cause is NCCL_SETTING_11=11 (each slows it by itself)" in note and "20 differences" in note
    assert {m.stage for m in proof.measurements} == {"single-node:without-suspects"}
    assert len(proof.measurements) == len(model.arms)


def test_two_culprits_are_both_named_and_a_pair_that_slows_only_together_is_named_as_a_pair() -> None:
    rows, _ = _proved(NodeModel(CONTAINER, {"NCCL_SETTING_02": 0.5, "OMP_NUM_THREADS": 0.6}))
    named = {k[1]: r.reason for k, r in rows.items() if k[0] == "job_settings" and r.status != Status.PASS}
    assert named == {"NCCL_SETTING_02": "confirmed", "OMP_NUM_THREADS": "confirmed"}
    rows, _ = _proved(NodeModel(CONTAINER, {}, [("NCCL_SETTING_05", "NCCL_SETTING_14", 0.3)]))
    named = {k[1]: r.reason for k, r in rows.items() if k[0] == "job_settings" and r.status != Status.PASS}
    assert named == {"NCCL_SETTING_05": "confirmed_together", "NCCL_SETTING_14": "confirmed_together"}
    assert "only together with NCCL_SETTING_14=14" in rows[("job_settings", "NCCL_SETTING_05")].detail


def test_the_reference_is_the_nodes_last_accepted_run_and_what_it_ran_with_is_no_suspect() -> None:
    run = {"run_id": "20261101T000000Z-a", "node": "n1", "probe": "gpu_bench", "also": ""}
    accepted = [
        {**run, "name": k, "value": v, "source": src} for k, (v, src) in CONTAINER.items() if k != "OMP_NUM_THREADS"
    ]
    state = _state(True)
    state.history = cast(Any, SimpleNamespace(settings=pd.DataFrame(accepted)))
    model = NodeModel(CONTAINER, {"OMP_NUM_THREADS": 0.3})
    rows, _ = _proved(model, state)
    assert [k[1] for k in rows if k[0] == "job_settings"] == ["OMP_NUM_THREADS"]  # the one difference
    confirmed = rows[("job_settings", "OMP_NUM_THREADS")]
    assert confirmed.reason == "confirmed" and "against its last accepted run 20261101T000000Z-a" in confirmed.detail
    assert model.arms == [{"OMP_NUM_THREADS": None}]  # one arm: the figure with it reverted


def test_a_setting_changed_since_the_reference_is_set_back_to_the_references_value() -> None:
    accepted = [
        {
            "run_id": "r0",
            "node": "n1",
            "probe": "gpu_bench",
            "name": "OMP_NUM_THREADS",
            "value": "16",
            "source": "env",
            "also": "",
        }
    ]
    state = _state(True)
    state.history = cast(Any, SimpleNamespace(settings=pd.DataFrame(accepted)))
    model = NodeModel({"OMP_NUM_THREADS": ("4", "env")}, {"OMP_NUM_THREADS": 0.3})
    rows, _ = _proved(model, state)
    assert model.arms == [{"OMP_NUM_THREADS": "16"}]
    row = rows[("job_settings", "OMP_NUM_THREADS")]
    assert (row.observed, row.expected, row.reason) == (
        "OMP_NUM_THREADS=4 (reference: '16')",
        "OMP_NUM_THREADS=16",
        "confirmed",
    )


def test_an_arm_pulled_down_by_what_ran_beside_it_is_measured_again_and_a_partial_recovery_is_not_restored() -> None:
    """Every third measurement halved (a load beside the node): an arm caught by it sits between the failing figure
    and the reference, is measured again, and its highest figure decides; two culprits, one reverted, leave the
    figure half-way however often it is measured: not restored, so both are named."""
    model = NodeModel(CONTAINER, {"NCCL_SETTING_02": 0.5, "OMP_NUM_THREADS": 0.6})
    plain, runs = model.figure, iter(range(1000))
    model.figure = lambda now: plain(now) * (0.5 if next(runs) % 3 == 2 else 1.0)  # type: ignore[method-assign]
    rows, proof = _proved(model)
    named = {k[1]: r.reason for k, r in rows.items() if k[0] == "job_settings" and r.status != Status.PASS}
    assert named == {"NCCL_SETTING_02": "confirmed", "OMP_NUM_THREADS": "confirmed"}
    assert len(proof.measurements) > len({frozenset(a) for a in map(dict.items, model.arms)})  # some measured again
    assert "(highest of " in " ".join(r.detail for r in rows.values())


def test_where_a_figure_sits_between_the_failing_figure_and_the_reference() -> None:
    assert position(100.0, 400.0, 200.0) == pytest.approx(0.5)
    assert position(100.0, 400.0, 400.0) == pytest.approx(1.0) and position(100.0, 90.0, 200.0) is None
    row = replace(_failing()[0], observed="100")
    assert row_call(Retest(row, "390", True), 400.0) == "restored"
    assert row_call(Retest(row, "120", False), 400.0) == "low"
    assert row_call(Retest(row, "200", False), 400.0) is None  # half-way: measured again
    assert row_call(Retest(row, "390", False), None) is None and row_call(Retest(row, "390", True), None) == "restored"


def test_a_regression_against_the_nodes_history_is_explained_against_its_last_accepted_run() -> None:
    """A figure that passes its floor and its peers but fell against the node's own history: the one setting added
    since the last accepted run is searched and proved against the floor the history row states."""
    run = {"run_id": "r0", "node": "n1", "probe": "gpu_bench", "also": ""}
    state = _state(True)
    state.history = cast(
        Any, SimpleNamespace(settings=pd.DataFrame([{**run, "name": "OMP_NUM_THREADS", "value": "4", "source": "env"}]))
    )
    model = NodeModel(
        {"OMP_NUM_THREADS": ("4", "env"), "CUDA_LAUNCH_BLOCKING": ("1", "env")}, {"CUDA_LAUNCH_BLOCKING": 0.9}
    )
    row = NodeRow("r", "c", "single-node", "n1", "gemm", "gemm_bf16_tflops_vs_history", Status.FAIL, "regression",
                  "630", ">= 665.0 TFLOP/s (own median - 5%)", "")  # fmt: skip
    before = measurement_frame([_figure("n1", 630.0)])
    proof = prove_causes(
        state, "single-node", [GEMM], [model.failing_run()], ([row], before), (model.measure, model.read)
    )
    named = [(r.item, r.reason) for r in proof.rows if r.check == "job_settings"]
    assert named == [("CUDA_LAUNCH_BLOCKING", "confirmed")] and model.arms == [{"CUDA_LAUNCH_BLOCKING": None}]
    assert "the cause is CUDA_LAUNCH_BLOCKING=1" in next(r.detail for r in proof.rows if r.check == "gemm")


def test_an_arm_that_ran_otherwise_than_asked_is_void_and_named() -> None:
    model = NodeModel(CONTAINER, {"NCCL_SETTING_03": 0.2})
    real = model.in_effect
    model.in_effect = lambda reverted: {**real(reverted), "NCCL_SETTING_03": ("3", "env")}  # type: ignore[method-assign]
    rows, _ = _proved(model)
    row = rows[("job_settings", "NCCL_SETTING_03")]
    assert (row.status, row.reason) == (Status.WARN, "suspect")
    assert "did not run as asked" in row.detail and "void: NCCL_SETTING_03 ran '3', asked unset" in row.detail


def test_a_figure_back_only_within_its_noise_is_not_restored() -> None:
    """The peers' figures spread by ±20 %: a figure from 560 to 600 has risen by less than three times that
    noise, so the settings reverted did not restore it (cleared), though it now passes its floor."""
    model = NodeModel({"OMP_NUM_THREADS": ("4", "env")}, {"OMP_NUM_THREADS": 560 / 600})
    model.figure = lambda now: 560.0 if "OMP_NUM_THREADS" in now else 600.0  # type: ignore[method-assign]
    before = measurement_frame([_figure("n1", 560.0), _figure("n2", 900.0), _figure("n3", 600.0), _figure("n4", 750.0)])
    failing = [replace(_failing()[0], observed="560")]
    proof = prove_causes(
        _state(True), "single-node", [GEMM], [model.failing_run()], (failing, before), (model.measure, model.read)
    )
    row = next(r for r in proof.rows if r.check == "job_settings")
    assert (row.item, row.reason) == ("OMP_NUM_THREADS", "cleared")


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
        (lambda n, q, p: NodeResult(n.name, NodeStatus.OK, commands=[CommandResult("training", 0, "", "")]),
         lambda o, p, s: [figure(0.904)]),
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
    # it says the settings it runs with: those it has, the removed ones unset or set as the run has them
    assert second.startswith(
        "( cd \"$CA_PROBE_DIR\" && env -u NCCL_MAX_NCHANNELS NCCL_PROTO='^' python3 job_settings.py ) "
    )
    assert first.startswith('( cd "$CA_PROBE_DIR" && python3 job_settings.py ) 2>/dev/null; ')
    assert REMOVED_SETTINGS.get() == {}  # nothing left set after the command was built
