"""``profile: auto`` expects a node's NVLink by the rule ``profile suggest`` writes (``checks.nvlink.expected_nvlink``):
a one-GPU H200 with no NVLink peer passes the nvlink check (in a run's preflight and in ``check --local``), eight
H200 listing no NVLink still fail ``nvlink:no_nvlink``, and on the same captured outputs the profile suggested is
the profile auto judges by. The outputs are those of ``tests/test_nvlink_expected.py``: real captures, a one-GPU
H200 cut from the 4-GPU one, an 8-GPU one from its four GPUs twice."""

from __future__ import annotations

from typing import Any

import pytest

import cluster_accept.checks.nvlink as nvlink
from cluster_accept.analysis.suggest import suggest_profile
from cluster_accept.analysis.verdicts import Verdict
from cluster_accept.checks import gpu_count
from cluster_accept.checks.base import Check, CheckRow, NodeRow, Status
from cluster_accept.flows import node_check, node_gather
from cluster_accept.inventory.builtin import resolve_auto, with_base
from cluster_accept.inventory.model import Inventory, Node, Profile, SshSettings
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.tasks.preflight.auto_profile import resolve_auto_nodes
from cluster_accept.tasks.preflight.check_batch import NodePreflight, parse_node_result
from cluster_accept.vocabulary.secrets import masked_cap
from tests.capture import NO_CLUSTER
from tests.test_nvlink_expected import H200_LINKS, NO_LINKS, gpu_list, links_output
from tests.test_profile_suggest import loaded, outputs, parsed

AUTO = Profile(base="auto")
ONE_GPU = {"gpu_count": gpu_list("h200x4", gpus=1), "nvlink": links_output("h100x1")}  # an H200 VM slice
EIGHT_DOWN = {"gpu_count": gpu_list("h200x4", gpus=8), "nvlink": links_output("h100x1")}  # links down
FOUR = {"gpu_count": gpu_list("h200x4"), "nvlink": links_output("h200x4")}  # healthy, as captured
ALONE = "one NVIDIA H200 on the node: no peer to join by NVLink, no link expected"
DOWN = (
    "8 GPUs of h200-sxm list no NVLink: their links are down, the datasheet's 18 x 26.562 GB/s per GPU stay "
    "expected (nvlink:no_nvlink)"
)
PASSED = [("links", None, "pass", "ok", "no NVLink", "no NVLink")]
NO_NVLINK = [("links", None, "fail", "no_nvlink", "no NVLink", "18 x 26.562 GB/s per GPU")]


def inventory(*names: str) -> Inventory:
    nodes = [Node(name, SshSettings(), "auto", AUTO) for name in names]
    return Inventory("c", nodes, {"auto": AUTO}, "inv.yaml", "x")


def auto_rows(nodes: dict[str, dict[str, str]]) -> tuple[Inventory, dict[str, NodeRow]]:
    """The inventory after ``profile: auto`` resolved each node from its parsed outputs, and its auto rows."""
    models = {name: {check: parsed_output(check, text) for check, text in out.items()} for name, out in nodes.items()}
    gpus = {name: m["gpu_count"] for name, m in models.items()}
    links = {name: m["nvlink"] for name, m in models.items()}
    resolved, rows = resolve_auto_nodes("r", inventory(*nodes), gpus, list(nodes), None, links)
    return resolved, {row.node: row for row in rows if row.item == "auto"}


def parsed_output(check: str, text: str) -> Any:
    return gpu_count.parse(text, 0) if check == "gpu_count" else nvlink.parse(text, 0)


def judged(profile: Profile, links: str) -> list[tuple[object, ...]]:
    rows: list[CheckRow] = nvlink.evaluate(nvlink.parse(links, 0), profile, NO_CLUSTER)
    return [(r.item, r.gpu, r.status.value, r.reason, r.observed, r.expected) for r in rows]


def test_a_one_gpu_h200_is_judged_without_nvlink_and_eight_listing_none_still_fail() -> None:
    resolved, rows = auto_rows({"one": ONE_GPU, "eight": EIGHT_DOWN, "four": FOUR})
    one, eight, four = (resolved.node(n) for n in ("one", "eight", "four"))
    assert (one.profile_name, one.profile.nvlink) == ("auto:h200-sxm:no-nvlink", NO_LINKS)
    assert one.profile.thresholds.allreduce_intra_busbw_gbps_min is None  # no peer: no all-reduce inside it
    assert one.profile.probes.expected_transport.intra_node is None
    assert one.profile.thresholds.gemm_bf16_tflops_min == 594.0  # the rest of h200-sxm stays
    assert (rows["one"].status, rows["one"].reason, rows["one"].expected) == (Status.PASS, "picked", "h200-sxm")
    assert rows["one"].detail == ALONE
    assert judged(one.profile, ONE_GPU["nvlink"]) == PASSED
    assert (eight.profile_name, eight.profile.nvlink) == ("auto:h200-sxm", H200_LINKS)
    assert eight.profile.thresholds.allreduce_intra_busbw_gbps_min == 287.0
    assert rows["eight"].detail == DOWN
    assert judged(eight.profile, EIGHT_DOWN["nvlink"]) == NO_NVLINK
    assert (four.profile_name, four.profile.nvlink, rows["four"].detail) == ("auto:h200-sxm", H200_LINKS, "")
    assert judged(four.profile, FOUR["nvlink"]) == [
        ("links", g, "pass", "ok", "18 x 26.562 GB/s", "18 x 26.562 GB/s") for g in range(4)
    ]


def test_the_profiles_own_nvlink_wins_over_what_auto_expects() -> None:
    own = Profile.model_validate({"base": "auto", "nvlink": {"links_per_gpu": 18, "link_speed_gbps": 26.562}})
    choice = resolve_auto(own, ["NVIDIA H200"], None, NO_LINKS)
    assert choice.problem is None and choice.profile.nvlink == H200_LINKS
    assert judged(choice.profile, ONE_GPU["nvlink"]) == NO_NVLINK


def test_no_nvlink_expected_keeps_the_transport_a_fabric_lays_between_nodes() -> None:
    between = {"probes": {"expected_transport": {"inter_node": "NET/IB"}}}
    alone = resolve_auto(AUTO, ["NVIDIA H200"], between, NO_LINKS).profile
    assert (alone.probes.expected_transport.intra_node, alone.probes.expected_transport.inter_node) == (None, "NET/IB")
    written = Profile.model_validate({"base": "auto", "nvlink": {"links_per_gpu": 0, "link_speed_gbps": 26.562}})
    own = resolve_auto(written, ["NVIDIA H200"], between).profile
    assert (own.probes.expected_transport.intra_node, own.probes.expected_transport.inter_node) == (None, "NET/IB")


def local_check(monkeypatch: pytest.MonkeyPatch, out: dict[str, str]) -> node_check.NodeCheck:
    """``cluster-accept check --local`` on a node whose gpu_count and nvlink commands print ``out`` (those two
    checks only: the others are what a lent machine has beside them)."""
    checks: list[Check[Any]] = [gpu_count.CHECK, nvlink.CHECK]
    commands = [CommandResult(c, 0, masked_cap(text, 1_000_000), masked_cap("", 10)) for c, text in out.items()]

    def ran(node: Node, _: object, __: object = None) -> NodePreflight:
        return parse_node_result(NodeResult(node.name, NodeStatus.OK, commands=commands), checks)

    monkeypatch.setattr(node_gather, "discover", lambda: checks)
    monkeypatch.setattr(node_gather, "run_preflight_on_node", ran)
    return node_check.check_node(inventory("gpu1"), "gpu1", "r", fresh=True)


def test_check_local_accepts_a_one_gpu_h200_and_rejects_eight_listing_no_nvlink(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = local_check(monkeypatch, ONE_GPU)
    assert one.verdict is not None and (one.verdict.verdict, one.verdict.reasons) == (Verdict.ACCEPTED, [])
    assert (one.exit_code, one.verdict.profile) == (0, "auto:h200-sxm:no-nvlink")
    nvlink_rows = [(r.status, r.reason, r.observed, r.expected) for r in one.rows if r.check == "nvlink"]
    assert nvlink_rows == [(Status.PASS, "ok", "no NVLink", "no NVLink")]
    eight = local_check(monkeypatch, EIGHT_DOWN)
    assert eight.verdict is not None
    assert (eight.verdict.verdict, eight.verdict.reasons) == (Verdict.REJECTED, ["nvlink:no_nvlink"])
    assert eight.exit_code == 1


@pytest.mark.parametrize(("out", "expected_rows"), [(ONE_GPU, PASSED), (EIGHT_DOWN, NO_NVLINK)], ids=["1gpu", "8gpu"])
def test_the_suggested_profile_is_the_one_auto_judges_by(out: dict[str, str], expected_rows: list[object]) -> None:
    """The same captured outputs through ``profile suggest`` (its YAML loaded over its base, as a run loads it)
    and through ``profile: auto``: the same NVLink, the same NVLink-derived figures, the same nvlink rows."""
    node = {**outputs("h200x4"), **out}
    suggested = with_base(loaded(suggest_profile({"gpu1": parsed(node)})))
    resolved, _ = auto_rows({"gpu1": out})
    auto = resolved.node("gpu1").profile
    assert suggested.nvlink == auto.nvlink
    figures = [
        (p.thresholds.allreduce_intra_busbw_gbps_min, p.probes.expected_transport.intra_node) for p in (auto, suggested)
    ]
    assert figures[0] == figures[1]
    assert judged(suggested, out["nvlink"]) == judged(auto, out["nvlink"]) == expected_rows


def test_suggest_says_why_where_the_nodes_list_no_nvlink() -> None:
    one = suggest_profile({"gpu1": parsed({**outputs("h200x4"), **ONE_GPU})}).splitlines()
    at = one.index("nvlink:")
    assert one[at - 2 : at + 3] == [
        "# nvlink where the nodes list none (gpu1): one NVIDIA H200 on the node: no peer to join by NVLink, no link",
        "# expected",
        "nvlink:",
        "  links_per_gpu: 0  # 1 of 1 nodes: gpu1; the base has 18",
        "  link_speed_gbps: 26.562  # 1 of 1 nodes: gpu1",
    ]
    nodes = {f"node0{i}": parsed({**outputs("h200x4"), **EIGHT_DOWN}) for i in (1, 2)}
    eight = suggest_profile(nodes).splitlines()
    at = eight.index("nvlink:")
    said = "# nvlink where the nodes list none (node[01-02]): 8 GPUs of h200-sxm list no NVLink: their links are down,"
    assert eight[at - 2 : at] == [
        f"{said} the",
        "# datasheet's 18 x 26.562 GB/s per GPU stay expected (nvlink:no_nvlink)",
    ]
    assert eight[at + 1] == "  links_per_gpu: 18  # 2 of 2 nodes: node[01-02]"
