"""The GPU-pair matrix judged on synthetic figures: a weak GPU, a weak link, a one-way slow pair, a 2-GPU node
slower than its peers, the profile's minimum; the probe's rows and its command."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from cluster_accept.analysis.gpu_pairs import judge_pairs, pair_of
from cluster_accept.checks.base import Status
from cluster_accept.inventory.model import Node, Profile, SshSettings, Thresholds
from cluster_accept.probes import gpu_pairs


def matrix(node: str, gpus: int, slow: dict[tuple[int, int], float] | None = None, base: float = 380.0) -> list[dict]:
    slow = slow or {}
    return [
        {"node": node, "profile": "h200", "metric": "gpu_pair_copy_gbps", "label": f"GPU{i}->GPU{j}", "gpu": i,
         "value": slow.get((i, j), base + i - j / 10), "unit": "GB/s"}
        for i in range(gpus) for j in range(gpus) if i != j
    ]  # fmt: skip


def findings(*frames: list[dict], limits: Thresholds | None = None) -> list[tuple[str, str, str]]:
    df = pd.DataFrame([r for f in frames for r in f])
    thresholds = {n: limits or Thresholds() for n in df.node.unique()}
    return [(f.node, f.item, f.reason) for f in judge_pairs(df, thresholds)]


def test_every_pair_to_and_from_one_gpu_slow_names_the_gpu() -> None:
    slow = {(i, j): 120.0 for i in range(4) for j in range(4) if i != j and 2 in (i, j)}
    assert findings(matrix("n1", 4, slow), matrix("n2", 4)) == [("n1", "GPU2", "weak_gpu")] + [
        ("n1", label, "straggler")
        for label in ("GPU0->GPU2", "GPU1->GPU2", "GPU2->GPU0", "GPU2->GPU1", "GPU2->GPU3", "GPU3->GPU2")
    ]


def test_a_pair_slow_both_ways_is_its_link_and_one_way_is_named_as_such() -> None:
    both = {(0, 3): 200.0, (3, 0): 210.0}
    assert findings(matrix("n1", 4, both)) == [("n1", "GPU0<->GPU3", "weak_link")]
    one_way = {(1, 2): 200.0}
    assert findings(matrix("n1", 4, one_way)) == [("n1", "GPU1->GPU2", "weak_direction")]
    assert findings(matrix("n1", 4)) == []  # a healthy node's spread (<1 %) is no finding at 5 %


def test_a_two_gpu_node_is_judged_against_the_same_pair_elsewhere_and_the_profile() -> None:
    # two GPUs: both directions share one link, so only the other nodes (and the minimum) can find it slow
    slow = {(0, 1): 150.0, (1, 0): 150.0}
    got = findings(matrix("a", 2, slow), matrix("b", 2), matrix("c", 2))
    assert got == [("a", "GPU0->GPU1", "straggler"), ("a", "GPU1->GPU0", "straggler")]
    floor = findings(matrix("a", 2), limits=Thresholds(gpu_pair_copy_gbps_min=400))
    assert floor == [("a", "GPU0->GPU1", "below_threshold"), ("a", "GPU1->GPU0", "below_threshold")]


def test_the_probe_writes_a_summary_row_per_node_then_each_problem() -> None:
    profile = Profile.model_validate({"thresholds": {"gpu_pair_copy_gbps_min": 300, "relative_verdict": "warn"}})
    df = pd.DataFrame(matrix("n1", 4, {(1, 2): 250.0}) + matrix("n2", 4))
    rows = gpu_pairs.evaluate(df, {"n1": profile, "n2": profile})
    summary = [(n, r.status, r.reason, r.observed, r.expected) for n, r in rows if r.item == "pairs"]
    assert summary == [
        ("n1", Status.FAIL, "below_threshold", "250.0", ">= 300.0 GB/s"),  # the node's slowest pair
        ("n2", Status.PASS, "ok", "379.7", ">= 300.0 GB/s"),
    ]
    assert "12 pairs: min 250.0" in rows[0][1].detail and "GPU1->GPU2 slowest" in rows[0][1].detail
    problems = [(n, r.item, r.status, r.reason) for n, r in rows if r.item != "pairs"]
    assert problems == [
        ("n1", "GPU1->GPU2", Status.FAIL, "below_threshold"),  # a profile minimum is never softened
        ("n1", "GPU1->GPU2", Status.WARN, "weak_direction"),  # relative findings follow relative_verdict
        ("n1", "GPU1->GPU2", Status.WARN, "straggler"),
    ]


def test_pairs_without_a_minimum_pass_only_where_something_compares_them() -> None:
    """No minimum (a GPU no built-in datasheet describes): a 2-GPU node alone has nothing to compare its pairs
    with and is not judged, naming the key; beside a peer, or with pairs of its own to compare, it passes."""
    profile = Profile.model_validate({"gpu": {"model": "NVIDIA Future GPU"}})
    alone = gpu_pairs.evaluate(pd.DataFrame(matrix("n1", 2)), {"n1": profile})
    assert [(r.item, r.status, r.reason, r.expected) for _, r in alone] == [
        ("pairs", Status.NOT_JUDGED, "no_expectation", "none: set thresholds.gpu_pair_copy_gbps_min")
    ]
    assert "no built-in datasheet describes 'NVIDIA Future GPU'" in alone[0][1].detail
    beside = gpu_pairs.evaluate(pd.DataFrame(matrix("n1", 2) + matrix("n2", 2)), {"n1": profile, "n2": profile})
    assert [(n, r.status, r.reason) for n, r in beside] == [("n1", Status.PASS, "ok"), ("n2", Status.PASS, "ok")]
    four = gpu_pairs.evaluate(pd.DataFrame(matrix("n1", 4)), {"n1": profile})
    assert [(r.status, r.reason) for _, r in four] == [(Status.PASS, "ok")]
    # a built-in GPU derives the minimum from its NVLink: 0.2 of 18 x 26.562 GB/s
    auto = Profile.model_validate({"gpu": {"model": "NVIDIA H200"}})
    ((_, row),) = gpu_pairs.evaluate(pd.DataFrame(matrix("n1", 2)), {"n1": auto})
    assert (row.status, row.expected) == (
        Status.PASS,
        ">= 96.0 GB/s (0.2 × NVLink 478 GB/s; set thresholds.gpu_pair_copy_gbps_min to change)",
    )


def test_the_node_side_output_parses_to_pair_figures_and_a_single_gpu_skips() -> None:
    lines = [json.dumps({"info": "probe", "probe": "gpu_pairs", "gpus": 2})] + [
        json.dumps({"probe": "gpu_pairs", "metric": "gpu_pair_copy_gbps", "label": f"GPU{i}->GPU{1 - i}", "gpu": i,
                    "peer": 1 - i, "value": 371.2 + i, "unit": "GB/s", "size": 268435456, "p2p": True})
        for i in (0, 1)
    ]  # fmt: skip
    out = gpu_pairs.parse("\n".join(lines))
    assert [(m.label, m.value) for m in out.measurements] == [("GPU0->GPU1", 371.2), ("GPU1->GPU0", 372.2)]
    assert pair_of("GPU1->GPU0") == (1, 0) and pair_of("GPU1<->GPU0") is None
    skipped = gpu_pairs.parse('{"info": "skip", "reason": "1 GPU: no GPU pairs"}')
    assert [(r.status, r.reason) for r in gpu_pairs.inspect(skipped, Profile())] == [(Status.SKIP, "single_gpu")]


def test_the_matrix_runs_only_on_cuda_profiles_that_ask_for_it() -> None:
    def node(probes: dict) -> Node:
        return Node("n1", SshSettings(), "p", Profile.model_validate({"probes": probes}))

    assert gpu_pairs.command(node({"device": "cpu"})) is None
    assert gpu_pairs.command(node({"gpu_pairs": False})) is None
    line = gpu_pairs.command(node({"cuda_visible_devices": "0,1", "command_prefix": "docker exec t"}), quick=True)
    assert (
        line
        == 'cd "$CA_PROBE_DIR" && exec docker exec t env CUDA_VISIBLE_DEVICES=0,1 python3 gpu_pairs.py --repeats 3 2>&1'
    )


def test_a_single_gpu_node_is_skipped_by_the_stage_with_no_finding() -> None:
    """One GPU has no pairs: neither healthy (nothing passes) nor a fault, so it is no sample of the probe."""
    from cluster_accept.inventory.model import DEFAULT_SSH, LOCAL_ADDRESS, Inventory
    from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
    from cluster_accept.tasks.probe_runs import judge_nodes

    profile = Profile.model_validate({"thresholds": {"gpu_pair_copy_gbps_min": 300}})
    node = Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS)
    inventory = Inventory("c", [node], {"p": profile}, "inventory.yaml", "digest")
    text = (Path(__file__).parent / "data" / "gpu_pairs" / "single_gpu.txt").read_text()
    run = NodeResult("n1", NodeStatus.OK, commands=[CommandResult(gpu_pairs.PROBE.script.name, 0, text, "")])
    rows = judge_nodes("r", inventory, [run], probes=[gpu_pairs.PROBE], stage=gpu_pairs.PROBE.stage).rows
    assert [(r.status, r.reason) for r in rows] == [(Status.SKIP, "single_gpu")]
