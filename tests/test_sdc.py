"""Silent data corruption judged across the cluster: a GPU whose product differs from its platform's majority, a
GPU whose repeats disagree, an even split, a GPU that gave no digest; platforms are never compared with each other."""

from __future__ import annotations

import json

import pandas as pd

from cluster_accept.analysis import sdc
from cluster_accept.checks.base import Status
from cluster_accept.inventory.burn_settings import BurnSettings
from cluster_accept.inventory.model import Profile
from cluster_accept.probes import sdc as probe

H100 = "NVIDIA H100 80GB HBM3 | torch 2.11.0+cu130 | CUDA 13.0"
H200 = "NVIDIA H200 | torch 2.11.0+cu130 | CUDA 13.0"


def digest(node: str, gpu: int, product: str = "aa", platform: str = H100, stable: bool = True) -> dict:
    return {"node": node, "gpu": gpu, "platform": platform, "size": 4096, "product": product, "sum": "0x1.8p+3",
            "stable": stable}  # fmt: skip


def reasons(rows: list[dict]) -> dict[tuple[str, int], str]:
    return {(f.node, f.gpu): f.reason for f in sdc.judge(pd.DataFrame(rows, columns=list(sdc.COLUMNS)))}


def test_one_flipped_gpu_among_its_node_and_cluster_is_named():
    rows = [digest(n, g) for n in ("node01", "node02") for g in range(4)]
    rows[5] = digest("node02", 1, "ab")
    found = reasons(rows)
    assert found[("node02", 1)] == "mismatch"
    assert sorted(k for k, r in found.items() if r == "same") == sorted(k for k in found if k != ("node02", 1))


def test_a_node_agreeing_with_itself_but_not_the_cluster_is_named():
    rows = [digest(n, g, "bb" if n == "node03" else "aa") for n in ("node01", "node02", "node03") for g in range(2)]
    assert {k for k, r in reasons(rows).items() if r == "mismatch"} == {("node03", 0), ("node03", 1)}


def test_platforms_are_judged_apart_and_an_even_split_names_no_culprit():
    rows = [digest("node01", 0), digest("node02", 0, "cc", H200), digest("node03", 0, "dd", H200)]
    found = reasons(rows)
    assert found[("node01", 0)] == "same"
    assert found[("node02", 0)] == found[("node03", 0)] == "no_majority"


def test_a_gpu_whose_repeats_disagree_is_unstable():
    rows = [digest("node01", 0), digest("node01", 1, stable=False), digest("node01", 2)]
    assert reasons(rows)[("node01", 1)] == "unstable"


def output(node_gpus: int, products: dict[int, list[str]] | None = None, platform: str = H100) -> probe.ProbeOutput:
    products = products or {}
    lines = [{"info": "probe", "probe": "burn", "gpus": node_gpus, "device": "cuda", "seconds": 0.0},
             {"info": "sdc_platform", "platform": platform}]  # fmt: skip
    for g in range(node_gpus):
        if g in products:
            lines.append({"info": "sdc", "gpu": g, "size": 4096, "products": products[g], "sums": ["0x1p+0"] * 3})
    return probe.parse("\n".join(json.dumps(x) for x in lines))


def test_compare_over_node_outputs_names_the_gpu_and_a_missing_digest():
    good = {g: ["aa"] * 3 for g in range(4)}
    outputs = {"node01": output(4, good), "node02": output(4, {**good, 2: ["ff", "ff", "ff"]}),
               "node03": output(4, {g: good[g] for g in (0, 1, 2)})}  # fmt: skip
    profiles = {n: Profile() for n in outputs}
    rows = {(node, row.item): row for node, row in probe.compare(outputs, profiles)}
    assert rows[("node02", "gpu2")].reason == "mismatch" and rows[("node02", "gpu2")].status is Status.FAIL
    assert rows[("node02", "gpu2")].expected == "aa/0x1p+0 (as 10 of 11 GPUs)"
    assert rows[("node03", "gpu3")].reason == "not_reported"
    assert rows[("node01", "gpu0")].reason == "same"
    off = {n: Profile(burn=BurnSettings(sdc=False)) for n in outputs}
    assert probe.compare(outputs, off) == []
