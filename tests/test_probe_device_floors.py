"""A floor the profile's probe device cannot measure is refused when the profile loads, by one rule over every
built-in profile: on CPU (gloo) every floor a built-in GPU profile brings is that GPU's (GEMM, HBM) or its
NVLink's (the intra-node all-reduce minimum), never what the CPU probes measure, and a node judged by one would be
rejected for it (``allreduce:below_threshold`` on every CPU node under 287 GB/s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.inventory.builtin import resolve_auto
from cluster_accept.inventory.gpus import MODELS, GpuModel, profile_data
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Profile, Thresholds
from cluster_accept.inventory.threshold_needs import NEEDS_CUDA

pytestmark = pytest.mark.unit

CPU_WHY = "probes.device is cpu: the GPU probes do not run"
NULL_HINT = "write them as null under thresholds to leave them out"


def _inventory(tmp_path: Path, profile: str, name: str = "p") -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(
        f"cluster: c\ndefaults: {{profile: {name}}}\nnodes: [{{hosts: 'n[1-2]'}}]\nprofiles:\n  {name}: {profile}\n"
    )
    return path


def _brought(model: GpuModel) -> list[str]:
    """The floors ``model``'s built-in profile sets, in the order a problem names them (the model's fields)."""
    keys = profile_data(model)["thresholds"]
    return [key for key in Thresholds.model_fields if key in keys]


def _nulls(keys: list[str]) -> str:
    return "{" + ", ".join(f"{key}: null" for key in keys) + "}"


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_every_floor_a_builtin_profile_brings_is_refused_on_cpu_naming_each(tmp_path: Path, model: GpuModel) -> None:
    with pytest.raises(InventoryError) as refused:
        load_inventory(_inventory(tmp_path, f"{{base: {model.key}, probes: {{device: cpu}}}}"))
    assert refused.value.problems == [
        f"profiles.p: profile 'p': thresholds {', '.join(_brought(model))} (from base {model.key}; {NULL_HINT}) "
        f"cannot be measured: {CPU_WHY} (on CPU the bench reports GEMM in GFLOP/s and host memory copy, and measures "
        "no GPU pair copy and no MFU; a built-in profile's floors are its GPU's, its all-reduce minimum NVLink's, not "
        "what gloo moves between processes); leave them out, or probe with device cuda"
    ]
    left_out = f"{{base: {model.key}, probes: {{device: cpu}}, thresholds: {_nulls(_brought(model))}}}"
    profile = load_inventory(_inventory(tmp_path, left_out)).nodes[0].profile
    assert [k for k, v in profile.thresholds.model_dump().items() if k in _brought(model) and v is not None] == []
    assert profile.gpu is not None and profile.gpu.model == model.smi_name  # the rest of the base stays


def test_the_nvlink_all_reduce_floor_on_cpu_is_refused_when_auto_loads(tmp_path: Path) -> None:
    """``profile: auto`` on CPU with the GPU-only floors left out: the NVLink-derived all-reduce minimum (287 GB/s
    for an H200) is refused at load too, not kept to reject every CPU node in the single-node stage."""
    gpu_only = [key for key in Thresholds.model_fields if key in NEEDS_CUDA]
    with pytest.raises(InventoryError) as refused:
        load_inventory(_inventory(tmp_path, f"{{probes: {{device: cpu}}, thresholds: {_nulls(gpu_only)}}}", "auto"))
    (problem,) = refused.value.problems
    assert problem.startswith(
        "profiles.auto: profile 'auto': thresholds allreduce_intra_busbw_gbps_min (from the built-in profile auto "
        f"picks; {NULL_HINT}) cannot be measured: {CPU_WHY}"
    )


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_no_cpu_node_is_judged_by_a_floor_of_the_gpu_auto_picks(model: GpuModel) -> None:
    """What preflight makes of a CPU-probed ``auto`` profile on each built-in model: never a profile holding one
    of that model's floors (the override is refused instead, naming them)."""
    gpu_only = {key: None for key in NEEDS_CUDA}
    own = Profile.model_validate({"base": "auto", "probes": {"device": "cpu"}, "thresholds": gpu_only})
    choice = resolve_auto(own, [model.smi_name])
    kept = [k for k in _brought(model) if getattr(choice.profile.thresholds, k) is not None]
    assert (choice.name, kept) == (model.key, [])
    nvlink_floor = "allreduce_intra_busbw_gbps_min" in _brought(model)
    assert (choice.problem is not None) == nvlink_floor, choice.problem
    if nvlink_floor:
        assert "allreduce_intra_busbw_gbps_min (from base" in str(choice.problem) and CPU_WHY in str(choice.problem)


def test_floors_the_operator_writes_for_gloo_still_load(tmp_path: Path) -> None:
    """The rule is about what a built-in GPU profile brings: an all-reduce minimum written for the CPU probes
    (the test-bed's gloo ranks) is what they measure, and loads."""
    floors = "allreduce_intra_busbw_gbps_min: 0.1, allreduce_inter_busbw_gbps_min: 0.03"
    own = f"{{probes: {{device: cpu}}, thresholds: {{{floors}}}}}"
    thresholds = load_inventory(_inventory(tmp_path, own)).nodes[0].profile.thresholds
    assert (thresholds.allreduce_intra_busbw_gbps_min, thresholds.allreduce_inter_busbw_gbps_min) == (0.1, 0.03)
