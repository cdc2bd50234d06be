"""Built-in GPU profiles: datasheet figures, thresholds as fractions of peak, ``base:`` overrides and ``auto``."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.checks import gpu_count
from cluster_accept.checks.base import Status
from cluster_accept.inventory.builtin import builtin_profile, resolve_auto, with_base
from cluster_accept.inventory.gpus import MODELS, model_for_name, profile_data
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Inventory, Node, Profile, SshSettings
from cluster_accept.tasks.preflight.auto_profile import resolve_auto_nodes
from tests.capture import captured


def _captured_name(machine: str) -> str:
    """The GPU name the real nvidia-smi printed in the field table of the capture."""
    stdout, _ = captured(machine, "query-gpu-noheader.txt")
    names = {gpu.name for gpu in gpu_count.parse(stdout, 0).gpus}
    assert len(names) == 1
    return names.pop()


@pytest.mark.parametrize(("machine", "key"), [("h100x1", "h100-sxm"), ("h200x4", "h200-sxm")])
def test_captured_gpu_names_pick_their_profile(machine: str, key: str) -> None:
    name = _captured_name(machine)
    assert name in {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    model = model_for_name(name)
    assert model is not None and model.key == key


# The names nvidia-smi --query-gpu=name prints for each product (the H100 SXM and H200 ones are in the captures).
SMI_NAMES = {
    "NVIDIA A100-SXM4-40GB": ("a100-sxm4-40gb", 187.0),
    "NVIDIA A100-SXM4-80GB": ("a100-sxm4-80gb", 187.0),
    "NVIDIA H100 80GB HBM3": ("h100-sxm", 594.0),
    "NVIDIA H100 PCIe": ("h100-pcie", 454.0),
    "NVIDIA H100 NVL": ("h100-nvl", 501.0),
    "NVIDIA H200": ("h200-sxm", 594.0),
    "NVIDIA H200 NVL": ("h200-nvl", 501.0),
    "NVIDIA B200": ("b200", 1350.0),
    "NVIDIA GB200": ("gb200", 1500.0),
    "NVIDIA L40S": ("l40s", 217.0),
}


def test_every_builtin_profile_has_a_name_to_be_picked_by() -> None:
    assert sorted(m.key for m in MODELS) == sorted(key for key, _ in SMI_NAMES.values())


@pytest.mark.parametrize(("smi_name", "expected"), SMI_NAMES.items())
def test_every_builtin_profile_is_picked_by_its_nvidia_smi_name(smi_name: str, expected: tuple[str, float]) -> None:
    choice = resolve_auto(Profile(base="auto"), [smi_name] * 4)
    assert choice.problem is None and choice.name == expected[0]
    assert choice.profile.gpu is not None and choice.profile.gpu.model == smi_name
    assert choice.profile.persistence_mode == "enabled"
    assert choice.profile.thresholds.gemm_bf16_tflops_min == expected[1]


def test_nvlink_bridged_cards_and_nodes_without_nvlink_expect_no_nvlink_all_reduce() -> None:
    nvl = Profile.model_validate(profile_data(model_for_name("NVIDIA H200 NVL")))  # type: ignore[arg-type]
    assert nvl.nvlink is not None and nvl.nvlink.links_per_gpu == 18  # the links are still checked per GPU
    assert nvl.thresholds.allreduce_intra_busbw_gbps_min is None  # a node-wide all-reduce crosses PCIe
    assert nvl.probes.expected_transport.intra_node is None
    no_links = Profile.model_validate({"base": "auto", "nvlink": {"links_per_gpu": 0, "link_speed_gbps": 26.562}})
    vm = resolve_auto(no_links, ["NVIDIA H100 80GB HBM3"]).profile
    assert vm.thresholds.allreduce_intra_busbw_gbps_min is None and vm.probes.expected_transport.intra_node is None
    assert vm.thresholds.gemm_bf16_tflops_min == 594.0  # everything else of the base stays
    kept = Profile.model_validate(
        {"base": "h100-sxm", "nvlink": None, "thresholds": {"allreduce_intra_busbw_gbps_min": 40}}
    )
    assert with_base(kept).thresholds.allreduce_intra_busbw_gbps_min == 40  # the profile's own key wins


def test_h100_sxm_thresholds_sit_under_what_was_measured() -> None:
    data = profile_data(model_for_name("NVIDIA H100 80GB HBM3"))  # type: ignore[arg-type]
    assert data["thresholds"] == {
        "gemm_bf16_tflops_min": 594.0,  # measured 660-775 (probe), 670-692 (refbench 8192^3)
        "gemm_fp16_tflops_min": 594.0,
        "gemm_tf32_tflops_min": 297.0,
        "hbm_copy_gbps_min": 2680.0,  # measured 3,028 on H100
        "gemm_fp8_tflops_min": 989.0,
        "allreduce_intra_busbw_gbps_min": 287.0,  # 18 x 26.562 x 0.6; 4 x H200 measured 355.6-362
    }
    assert data["nvlink"] == {"links_per_gpu": 18, "link_speed_gbps": 26.562}
    assert data["pcie"] == {"gen": 5, "width": 16}
    assert data["gpu"] == {"model": "NVIDIA H100 80GB HBM3"}  # 4- and 8-GPU HGX boards: the cluster's majority
    h200 = profile_data(model_for_name("NVIDIA H200"))  # type: ignore[arg-type]
    assert h200["thresholds"]["hbm_copy_gbps_min"] == 3840.0  # measured 4,223-4,273


def test_pcie_cards_expect_the_majority_count_and_judge_no_nvlink() -> None:
    l40s = Profile.model_validate(profile_data(model_for_name("NVIDIA L40S")))  # type: ignore[arg-type]
    assert l40s.gpu is not None and l40s.gpu.count is None
    assert l40s.nvlink is None and l40s.thresholds.allreduce_intra_busbw_gbps_min is None
    a100 = Profile.model_validate(profile_data(model_for_name("NVIDIA A100-SXM4-80GB")))  # type: ignore[arg-type]
    assert a100.thresholds.gemm_fp8_tflops_min is None  # no fp8 tensor cores


def test_unknown_and_mixed_models_say_what_to_write() -> None:
    unknown = resolve_auto(Profile(base="auto"), ["NVIDIA RTX 6000 Ada Generation"])
    assert unknown.name is None and unknown.problem is not None
    assert "gpu.model: 'NVIDIA RTX 6000 Ada Generation'" in unknown.problem
    assert "gemm_bf16_tflops_min" in unknown.problem and "h100-sxm" in unknown.problem
    mixed = resolve_auto(Profile(base="auto"), ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
    assert mixed.problem is not None and "several models" in mixed.problem
    assert resolve_auto(Profile(base="auto"), []).problem is not None


def test_own_keys_win_key_by_key() -> None:
    own = Profile.model_validate(
        {"base": "h200-sxm", "thresholds": {"gemm_bf16_tflops_min": 650}, "gpu": {"model": "NVIDIA H200", "count": 4}}
    )
    merged = with_base(own)
    assert merged.thresholds.gemm_bf16_tflops_min == 650
    assert merged.thresholds.hbm_copy_gbps_min == 3840.0  # kept from the base
    assert merged.gpu is not None and merged.gpu.count == 4
    assert merged.nvlink is not None and merged.nvlink.links_per_gpu == 18
    with pytest.raises(ValueError, match="not a built-in profile"):
        with_base(Profile(base="h300"))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return path


def test_inventory_names_builtin_profiles_and_refuses_unknown_bases(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, "cluster: c\ndefaults: {profile: h100-sxm}\nnodes: [{hosts: 'n[1-2]'}]\n"))
    assert inv.nodes[0].profile == builtin_profile("h100-sxm")
    text = "cluster: c\ndefaults: {profile: mine}\nnodes: [{hosts: n1}]\nprofiles: {mine: {base: h300}}\n"
    with pytest.raises(InventoryError, match=r"profiles\.mine: profile 'mine': base 'h300' is not a built-in"):
        load_inventory(_write(tmp_path, text))
    with pytest.raises(InventoryError, match="is not built in"):
        load_inventory(_write(tmp_path, "cluster: c\ndefaults: {profile: h999}\nnodes: [{hosts: n1}]\n"))


def test_auto_with_inline_overrides(tmp_path: Path) -> None:
    text = (
        "cluster: c\ndefaults: {profile: auto}\nnodes: [{hosts: n1}]\n"
        "profiles: {auto: {nccl_env: {NCCL_SOCKET_IFNAME: eth0}, thresholds: {hbm_copy_gbps_min: 4000}}}\n"
    )
    inv = load_inventory(_write(tmp_path, text))
    node = inv.nodes[0]
    assert node.profile.base == "auto"
    choice = resolve_auto(node.profile, ["NVIDIA H200"])
    assert choice.profile.thresholds.hbm_copy_gbps_min == 4000
    assert choice.profile.thresholds.gemm_bf16_tflops_min == 594.0
    assert choice.profile.nccl_env == {"NCCL_SOCKET_IFNAME": "eth0"}


def _gpus(names: list[str]) -> object:
    stdout = "".join(f"{i}, {name}, 580.159.04, Enabled, 16, 16\n" for i, name in enumerate(names))
    return gpu_count.parse(stdout, 0)


def test_resolve_auto_nodes_puts_each_node_on_its_profile() -> None:
    auto = Profile(base="auto")
    nodes = [Node(n, SshSettings(), "auto", auto) for n in ("a", "b", "c", "d")]
    inventory = Inventory("c", nodes, {"auto": auto}, "inv.yaml", "x")
    models = {
        "a": _gpus(["NVIDIA H200"] * 8),
        "b": _gpus(["NVIDIA H100 80GB HBM3"] * 8),
        "c": _gpus(["NVIDIA RTX 6000 Ada Generation"] * 2),
        "d": None,
    }
    resolved, rows = resolve_auto_nodes("r", inventory, models, ["a", "b", "c", "d"])
    by_node = {row.node: row for row in rows if row.item == "auto"}
    assert resolved.node("a").profile_name == "auto:h200-sxm"
    assert resolved.node("b").profile.thresholds.hbm_copy_gbps_min == 2680.0
    assert (by_node["a"].status, by_node["a"].reason, by_node["a"].expected) == (Status.PASS, "picked", "h200-sxm")
    assert (by_node["c"].status, by_node["c"].reason) == (Status.FAIL, "unknown_gpu")
    assert resolved.node("c").profile is auto
    assert (by_node["d"].status, by_node["d"].reason) == (Status.SKIP, "gpu_unreadable")


def test_auto_without_preflight_is_refused(tmp_path: Path) -> None:
    from cluster_accept.rundir.run import refuse_unresolved_auto

    inv = load_inventory(_write(tmp_path, "cluster: c\ndefaults: {profile: auto}\nnodes: [{hosts: 'n[1-3]'}]\n"))
    refuse_unresolved_auto(inv, ["preflight", "single-node"])  # preflight resolves it: accepted
    with pytest.raises(ValueError, match=r"nodes n\[1-3\] use profile auto.*add preflight to --stages"):
        refuse_unresolved_auto(inv, ["single-node"])


def test_a_run_refuses_by_itself_before_its_directory_exists(tmp_path: Path) -> None:
    """``Run.begin`` and ``Run.begin_bisect`` refuse what the command line refuses, by the same call: a flow
    that starts a run cannot skip the refusals, and a refused run leaves no directory behind."""
    from cluster_accept.ops.after_run import Operations
    from cluster_accept.rundir.run import BisectChoices, NothingToTest, Run, RunChoices

    text = "cluster: c\ndefaults: {profile: auto}\nnodes: [{hosts: 'n[1-4]'}]\nexclude: [n4]\n"
    path = _write(tmp_path, text)
    out = tmp_path / "runs"
    choices = RunChoices(path, ["single-node"], False, None, Operations(), 8)
    with pytest.raises(ValueError, match=r"nodes n\[1-3\] use profile auto.*add preflight to --stages"):
        Run.begin(choices, load_inventory, out)
    with pytest.raises(ValueError, match=r"use profile auto"):
        Run.begin_bisect(BisectChoices(path, "n1"), load_inventory, out)
    with pytest.raises(NothingToTest, match="no node to test"):
        Run.begin(RunChoices(path, ["preflight"], False, None, Operations(), 8, nodes="n4"), load_inventory, out)
    assert not out.exists()
    run = Run.begin(RunChoices(path, ["preflight"], False, None, Operations(), 8), load_inventory, out, "r1")
    run.directory.release()
    assert [n.name for n in run.inventory.tested] == ["n1", "n2", "n3"]
