"""What NVLink a node should show (``checks.nvlink.expected_nvlink``), on the real captures and variants cut from
them: a GPU alone on its node expects none, GPUs with peers that list none keep the datasheet's links (their
links are down), and the nvlink check judges a node by what was decided.

The captures: ``h200x4`` (four H200 SXM, 18 links each at 26.562 GB/s) and ``h100x1`` (one H100 SXM in a virtual
machine: ``nvlink -s`` and ``-e`` print nothing, exit 0). A one-GPU H200 is the h200x4 GPU list cut to GPU 0 with
the h100x1 NVLink output (same driver, 580.159.04; the h200x1 machine of the shared captures shows the same: one
H200, no NVLink peer, no fabric); an 8-GPU H200 is the h200x4 list with its four GPUs again as GPUs 4-7.
"""

from __future__ import annotations

import pytest

import cluster_accept.checks.nvlink as nvlink
from cluster_accept.checks import gpu_count
from cluster_accept.checks.base import CheckRow
from cluster_accept.inventory.gpus import model_for_name
from cluster_accept.inventory.model import NvlinkSpec, Profile
from tests.capture import DRIVER_FAILURE, NO_CLUSTER, captured

MARK = "### nvidia-smi nvlink -s rc="
H200_LINKS = NvlinkSpec(links_per_gpu=18, link_speed_gbps=26.562)
NO_LINKS = NvlinkSpec(links_per_gpu=0, link_speed_gbps=26.562)


def gpu_list(machine: str = "h200x4", gpus: int | None = None) -> str:
    """``gpu_count``'s output on ``machine``: its first ``gpus`` GPUs, or its GPUs again (renumbered) up to them."""
    lines, _ = captured(machine, "query-gpu-noheader.txt")
    rows = lines.splitlines(keepends=True)
    wanted = gpus or len(rows)
    return "".join(f"{i}, {rows[i % len(rows)].split(', ', 1)[1]}" for i in range(wanted))


def links_output(machine: str = "h200x4", first_gpu_only: bool = False) -> str:
    """The nvlink check's command output on ``machine`` (``nvlink -s``, the mark, ``nvlink -e``)."""
    status, status_rc = captured(machine, "nvlink-s.txt")
    errors, _ = captured(machine, "nvlink-e.txt")
    if first_gpu_only:
        status, errors = status.split("GPU 1:")[0], errors.split("GPU 1:")[0]
    return f"{status}{MARK}{status_rc}\n{errors}"


def decided(gpus: str, links: str, links_rc: int = 0) -> nvlink.ExpectedLinks | None:
    return nvlink.node_expected_nvlink(gpu_count.parse(gpus, 0), nvlink.parse(links, links_rc))


def rows_of(rows: list[CheckRow]) -> list[tuple[str, int | None, str, str, str | None, str | None]]:
    return [(r.item, r.gpu, r.status.value, r.reason, r.observed, r.expected) for r in rows]


def judged(links: str, spec: NvlinkSpec) -> list[tuple[str, int | None, str, str, str | None, str | None]]:
    return rows_of(nvlink.evaluate(nvlink.parse(links, 0), Profile(nvlink=spec), NO_CLUSTER))


def test_a_node_listing_its_links_expects_the_datasheet_and_says_nothing_more() -> None:
    found = decided(gpu_list("h200x4"), links_output("h200x4"))
    assert found == nvlink.ExpectedLinks(H200_LINKS, None)


@pytest.mark.parametrize(
    ("gpus", "name"),
    [(gpu_list("h200x4", gpus=1), "NVIDIA H200"), (gpu_list("h100x1"), "NVIDIA H100 80GB HBM3")],
    ids=["h200x1", "h100x1"],
)
def test_one_gpu_listing_no_nvlink_expects_none(gpus: str, name: str) -> None:
    found = decided(gpus, links_output("h100x1"))
    assert found == nvlink.ExpectedLinks(
        NO_LINKS, f"one {name} on the node: no peer to join by NVLink, no link expected"
    )
    assert judged(links_output("h100x1"), found.spec) == [("links", None, "pass", "ok", "no NVLink", "no NVLink")]


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_gpus_with_peers_listing_no_nvlink_keep_the_datasheet_and_fail(gpus: int) -> None:
    found = decided(gpu_list("h200x4", gpus=gpus), links_output("h100x1"))
    why = (
        f"{gpus} GPUs of h200-sxm list no NVLink: their links are down, the datasheet's 18 x 26.562 GB/s per GPU "
        "stay expected (nvlink:no_nvlink)"
    )
    assert found == nvlink.ExpectedLinks(H200_LINKS, why)
    assert judged(links_output("h100x1"), found.spec) == [
        ("links", None, "fail", "no_nvlink", "no NVLink", "18 x 26.562 GB/s per GPU")
    ]


def test_a_lone_gpu_that_lists_active_links_is_judged_on_them() -> None:
    one = links_output("h200x4", first_gpu_only=True)
    found = decided(gpu_list("h200x4", gpus=1), one)
    assert found == nvlink.ExpectedLinks(H200_LINKS, None)
    assert judged(one, found.spec) == [("links", 0, "pass", "ok", "18 x 26.562 GB/s", "18 x 26.562 GB/s")]


def test_a_lone_gpu_showing_its_links_inactive_expects_none_and_passes() -> None:
    one = links_output("h200x4", first_gpu_only=True)
    status, _, errors = one.partition(MARK)
    inactive = "".join(line.replace("26.562 GB/s", "<inactive>") + "\n" for line in status.splitlines())
    shown = f"{inactive}{MARK}{errors}"
    found = decided(gpu_list("h200x4", gpus=1), shown)
    assert found is not None and found.spec == NO_LINKS
    assert judged(shown, found.spec) == [("links", 0, "pass", "ok", "18 inactive", "0 links")]
    # The same GPU under the datasheet's 18 links: each link is down.
    assert judged(shown, H200_LINKS)[0] == ("link0", 0, "fail", "link_inactive", "<inactive>", "26.562 GB/s")


def test_nvidia_smi_failing_on_nvlink_decides_by_the_gpu_count_alone() -> None:
    dead = DRIVER_FAILURE + MARK + "9\n" + DRIVER_FAILURE
    one = nvlink.node_expected_nvlink(gpu_count.parse(gpu_list("h200x4", gpus=1), 0), nvlink.parse(dead, 9))
    assert one is not None and one.spec == NO_LINKS
    four = nvlink.node_expected_nvlink(gpu_count.parse(gpu_list("h200x4"), 0), nvlink.parse(dead, 9))
    assert four == nvlink.ExpectedLinks(H200_LINKS, None)  # the check says why nothing was judged


def test_no_expectation_without_one_built_in_model_with_nvlink() -> None:
    none_listed = nvlink.parse(links_output("h100x1"), 0)
    l40s = model_for_name("NVIDIA L40S")
    assert nvlink.expected_nvlink(l40s, 1, none_listed) is None  # no NVLink on the card: the profile has none
    assert nvlink.expected_nvlink(None, 1, none_listed) is None  # no built-in model: the profile's own keys say
    renamed = gpu_list("h200x4", gpus=1).replace("NVIDIA H200", "NVIDIA X300")
    assert nvlink.node_expected_nvlink(gpu_count.parse(renamed, 0), none_listed) is None
    mixed = gpu_list("h200x4", gpus=2).replace("1, NVIDIA H200", "1, NVIDIA H100 80GB HBM3")
    assert nvlink.node_expected_nvlink(gpu_count.parse(mixed, 0), none_listed) is None
    assert nvlink.node_expected_nvlink(gpu_count.parse(DRIVER_FAILURE, 9), none_listed) is None
    assert nvlink.node_expected_nvlink(None, None) is None
