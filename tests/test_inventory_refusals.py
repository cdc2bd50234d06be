"""Inventory errors that used to pass ``inventory check`` and fail every node later, refused at load instead:
thresholds no probe of the profile measures, non-finite numbers, names that break the line they are printed on,
and problems that echoed a refused value whole."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
from typer.testing import CliRunner

from cluster_accept.flows.cli import app
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Thresholds
from cluster_accept.inventory.probe_settings import ExtraCollective, busbw_threshold
from cluster_accept.inventory.threshold_needs import CUDA_WHY, NEEDS_CPU, NEEDS_CUDA, NEEDS_TWO_GPUS
from cluster_accept.tasks.stages import declared_expectations
from tests.processes import run_cli

HEAD = "cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: 'n[1-2]'}]\n"
CPU_WHY = "probes.device is cpu: the GPU probes do not run"


def inventory(tmp_path: Path, profile: str, head: str = HEAD) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(f"{head}profiles:\n  p: {profile}\n", encoding="utf-8")
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    return info.value.problems


def only_problem(path: Path) -> str:
    (problem,) = problems(path)
    return problem


# 1. Thresholds the profile's probes cannot measure -------------------------------------------------------


def test_gpu_thresholds_on_cpu_probes_are_refused_naming_every_key(tmp_path: Path) -> None:
    profile = (
        "{probes: {device: cpu}, thresholds: {gemm_bf16_tflops_min: 600, gemm_fp8_tflops_min: 900, "
        "hbm_copy_gbps_min: 3000, gpu_pair_copy_gbps_min: 300, training_mfu_min: 0.3, "
        "allreduce_inter_busbw_gbps_min: 1}}"
    )
    problem = only_problem(inventory(tmp_path, profile))
    assert problem.startswith(
        "profiles.p: Value error, thresholds gemm_bf16_tflops_min, gemm_fp8_tflops_min, hbm_copy_gbps_min, "
        f"gpu_pair_copy_gbps_min, training_mfu_min cannot be measured: {CPU_WHY}"
    )
    assert "allreduce_inter_busbw_gbps_min" not in problem  # gloo measures it on CPU


def test_thresholds_cpu_probes_measure_still_load(tmp_path: Path) -> None:
    profile = (
        "{probes: {device: cpu, collectives: [all_gather]}, thresholds: {allreduce_intra_busbw_gbps_min: 0.1, "
        "allgather_intra_busbw_gbps_min: 0.1, allreduce_inter_busbw_gbps_min: 0.03, scaling_efficiency_min: 0.5, "
        "training_tokens_per_s_per_gpu_min: 100, training_scaling_efficiency_min: 0.5}, gpu: {count: 1}}"
    )
    assert load_inventory(inventory(tmp_path, profile)).nodes[0].profile.probes.device == "cpu"


def test_thresholds_between_gpus_need_two_of_them(tmp_path: Path) -> None:
    thresholds = "allreduce_intra_busbw_gbps_min: 300, allgather_intra_busbw_gbps_min: 200, gpu_pair_copy_gbps_min: 250"
    problem = only_problem(inventory(tmp_path, f"{{gpu: {{count: 1}}, thresholds: {{{thresholds}}}}}"))
    assert problem.startswith(
        "profiles.p: Value error, thresholds allreduce_intra_busbw_gbps_min, allgather_intra_busbw_gbps_min, "
        "gpu_pair_copy_gbps_min cannot be measured: gpu.count is 1: they are measured between the GPUs of one node"
    )
    partition = f"{{probes: {{cuda_visible_devices: '3'}}, thresholds: {{{thresholds}}}}}"
    assert "probes.cuda_visible_devices '3' names 1 GPU: " in only_problem(inventory(tmp_path, partition))
    two = load_inventory(inventory(tmp_path, f"{{gpu: {{count: 2}}, thresholds: {{{thresholds}}}}}"))
    assert two.nodes[0].profile.thresholds.gpu_pair_copy_gbps_min == 250


def test_thresholds_a_builtin_base_brings_to_cpu_probes_are_refused_saying_where_they_come_from(
    tmp_path: Path,
) -> None:
    problem = only_problem(inventory(tmp_path, "{base: h100-sxm, probes: {device: cpu}}"))
    assert problem.startswith(
        "profiles.p: profile 'p': thresholds gemm_bf16_tflops_min, gemm_fp16_tflops_min, gemm_tf32_tflops_min, "
        "gemm_fp8_tflops_min, hbm_copy_gbps_min, allreduce_intra_busbw_gbps_min (from base h100-sxm; write them as "
        f"null under thresholds to leave them out) cannot be measured: {CPU_WHY}"
    )
    nulls = ", ".join(f"{key}: null" for key in ("gemm_bf16", "gemm_fp16", "gemm_tf32", "gemm_fp8"))
    nulls = nulls.replace(": null", "_tflops_min: null") + ", hbm_copy_gbps_min: null"
    nulls += ", allreduce_intra_busbw_gbps_min: null"
    kept = load_inventory(inventory(tmp_path, f"{{base: h100-sxm, probes: {{device: cpu}}, thresholds: {{{nulls}}}}}"))
    profile = kept.nodes[0].profile
    assert profile.thresholds.gemm_bf16_tflops_min is None and profile.thresholds.allreduce_intra_busbw_gbps_min is None
    assert profile.gpu is not None and profile.gpu.model == "NVIDIA H100 80GB HBM3"  # the rest of the base stays


def test_an_auto_profile_is_checked_over_every_builtin_profile_it_may_pick(tmp_path: Path) -> None:
    head = HEAD.replace("profile: p", "profile: auto")
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text(f"{head}profiles:\n  auto: {{probes: {{device: cpu}}}}\n")
    assert only_problem(cpu).startswith(
        "profiles.auto: profile 'auto': thresholds gemm_bf16_tflops_min, gemm_fp16_tflops_min, gemm_tf32_tflops_min, "
        "gemm_fp8_tflops_min, hbm_copy_gbps_min, allreduce_intra_busbw_gbps_min (from the built-in profile auto "
        f"picks; write them as null under thresholds to leave them out) cannot be measured: {CPU_WHY}"
    )
    one_gpu = tmp_path / "one.yaml"
    one_gpu.write_text(f"{head}profiles:\n  auto: {{gpu: {{count: 1}}}}\n")
    assert only_problem(one_gpu).startswith(
        "profiles.auto: profile 'auto': thresholds allreduce_intra_busbw_gbps_min (from the built-in profile auto "
        "picks; write them as null under thresholds to leave them out) cannot be measured: gpu.count is 1"
    )
    vm = tmp_path / "vm.yaml"  # bench/inventories/h100x1-auto.yaml: one GPU, no NVLink, so no all-reduce minimum
    vm.write_text(
        f"{head}profiles:\n  auto: {{gpu: {{count: 1}}, nvlink: {{links_per_gpu: 0, link_speed_gbps: 26.562}}}}\n"
    )
    assert load_inventory(vm).nodes[0].profile.base == "auto"


def test_a_profile_file_is_refused_like_an_inline_profile(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "cpu.yaml").write_text("probes: {device: cpu}\nthresholds: {hbm_copy_gbps_min: 1}\n")
    path = tmp_path / "inventory.yaml"
    path.write_text(HEAD.replace("profile: p", "profile: cpu"))
    problem = only_problem(path)
    assert problem.startswith("defaults.profile -> ")
    assert f"cpu.yaml: (top level): Value error, thresholds hbm_copy_gbps_min cannot be measured: {CPU_WHY}" in problem


def test_cpu_figures_minimums_on_gpu_probes_are_refused_and_load_on_cpu(tmp_path: Path) -> None:
    """The CPU bench's GFLOP/s, host memory copy and CPU burn are never measured on a GPU node; on CPU they are
    the only minimums a one-node run can be judged by."""
    keys = "gemm_fp32_gflops_min: 40, mem_copy_gbps_min: 5, burn_gflops_min: 30"
    problem = only_problem(inventory(tmp_path, f"{{thresholds: {{{keys}, h2d_gbps_min: 20}}}}"))
    assert problem == (
        "profiles.p: Value error, thresholds gemm_fp32_gflops_min, mem_copy_gbps_min, burn_gflops_min cannot be "
        f"measured: {CUDA_WHY}"
    )
    cpu = load_inventory(inventory(tmp_path, f"{{probes: {{device: cpu}}, thresholds: {{{keys}}}}}"))
    assert cpu.nodes[0].profile.thresholds.mem_copy_gbps_min == 5
    assert "h2d_gbps_min" in only_problem(inventory(tmp_path, "{probes: {device: cpu}, thresholds: {h2d_gbps_min: 9}}"))


def test_a_burn_minimum_without_a_burn_is_refused(tmp_path: Path) -> None:
    profile = "{burn: {minutes: 0, light_minutes: 0}, thresholds: {burn_tflops_min: 500}}"
    assert only_problem(inventory(tmp_path, profile)) == (
        "profiles.p: Value error, thresholds burn_tflops_min need the burn: burn.minutes and burn.light_minutes are 0"
    )


def test_burn_limits_without_a_burn_are_refused(tmp_path: Path) -> None:
    profile = "{burn: {minutes: 0, light_minutes: 0, throughput_drop_max_pct: 5, clock_drop_max_pct: 5}}"
    assert only_problem(inventory(tmp_path, profile)).startswith(
        "profiles.p.burn: Value error, burn.throughput_drop_max_pct, burn.clock_drop_max_pct judge the sustained "
        "load, and burn.minutes and burn.light_minutes are 0"
    )
    light = "{burn: {minutes: 0, light_minutes: 1, throughput_drop_max_pct: 5}}"
    assert load_inventory(inventory(tmp_path, light)).nodes[0].profile.burn.throughput_drop_max_pct == 5


def test_every_threshold_said_to_need_a_gpu_is_one_coverage_judges() -> None:
    """The table the loader refuses by and the table coverage judges by name the same keys."""
    judged = {e.name for e in declared_expectations()}
    for key in (*NEEDS_CUDA, *NEEDS_CPU, *NEEDS_TWO_GPUS):
        assert key in Thresholds.model_fields and key in judged, key
    assert {busbw_threshold(op, "intra") for op in get_args(ExtraCollective)} <= set(NEEDS_TWO_GPUS)


# 2. Non-finite numbers ------------------------------------------------------------------------------------

NON_FINITE = {
    "thresholds: {allreduce_inter_busbw_gbps_min: .inf}": "profiles.p.thresholds.allreduce_inter_busbw_gbps_min",
    "thresholds: {gemm_bf16_tflops_min: .inf}": "profiles.p.thresholds.gemm_bf16_tflops_min",
    "thresholds: {hbm_copy_gbps_min: -.inf}": "profiles.p.thresholds.hbm_copy_gbps_min",
    "thresholds: {straggler_pct: .nan}": "profiles.p.thresholds.straggler_pct",
    "nvlink: {links_per_gpu: 18, link_speed_gbps: .inf}": "profiles.p.nvlink.link_speed_gbps",
    "infiniband: {rate_gbps: .inf}": "profiles.p.infiniband.rate_gbps",
    "training: {peak_tflops: .inf}": "profiles.p.training.peak_tflops",
}


@pytest.mark.parametrize("setting", sorted(NON_FINITE))
def test_non_finite_numbers_are_refused(tmp_path: Path, setting: str) -> None:
    problem = only_problem(inventory(tmp_path, f"{{{setting}}}"))
    assert problem.startswith(f"{NON_FINITE[setting]}: Input should be a finite number (got ")


# 3. Names that break the line they are printed on ---------------------------------------------------------


LINE_BREAKS = {
    'cluster: "c\\n# injected"\ndefaults: {profile: p}\nnodes: [{hosts: n1}]\n': "cluster: Value error, holds '\\n'",
    'cluster: c\ndefaults: {profile: p, labels: {rack: "r1\\r\\n## x"}}\nnodes: [{hosts: n1}]\n': (
        "defaults.labels.rack: Value error, holds '\\r'"
    ),
    'cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: n1, labels: {"a\\tb": r1}}]\n': (
        "nodes[0].labels.'a\\tb'[key]: Value error, holds '\\t'"
    ),
    'cluster: "c\\u2028x"\ndefaults: {profile: p}\nnodes: [{hosts: n1}]\n': "cluster: Value error, holds '\\u2028'",
}


@pytest.mark.parametrize("head", sorted(LINE_BREAKS))
def test_names_that_break_their_line_are_refused(tmp_path: Path, head: str) -> None:
    problem = only_problem(inventory(tmp_path, "{}", head))
    assert problem.startswith(LINE_BREAKS[head])
    assert "which breaks the line a name is printed on (the heading of report.md" in problem


def test_a_profile_name_that_breaks_its_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text('cluster: c\ndefaults: {profile: "p\\nq"}\nnodes: [{hosts: n1}]\nprofiles: {"p\\nq": {}}\n')
    assert any(p.startswith("profiles.'p\\nq'[key]: Value error, holds '\\n' at position 1") for p in problems(path))


def test_cluster_with_a_newline_never_reaches_report_md(tmp_path: Path) -> None:
    path = inventory(tmp_path, "{}", 'cluster: "ok\\n# Acceptance of another cluster"\n' + HEAD.split("\n", 1)[1])
    result = CliRunner().invoke(app, ["inventory", "check", str(path)])
    assert result.exit_code == 2 and "cluster: Value error, holds '\\n' at position 2" in result.output


# 4. A refused value is quoted by its first 200 characters -------------------------------------------------


def test_an_over_long_hostlist_is_quoted_by_its_first_200_characters(tmp_path: Path) -> None:
    hosts = "x" * (7_340_032 - 2) + " y"
    path = tmp_path / "inventory.yaml"
    path.write_text(f"cluster: c\ndefaults: {{profile: p}}\nnodes: [{{hosts: '{hosts}'}}]\nprofiles: {{p: {{}}}}\n")
    problem = only_problem(path)
    assert problem == f"nodes[0].hosts: whitespace inside hostlist expression {'x' * 200!r}… (7,340,032 characters)"


LONG = 10_000
OVER_LONG = {
    "bad hostlist": (
        f"nodes: [{{hosts: 'n[{'a' * LONG}'}}]\n",
        f"nodes[0].hosts: bad hostlist expression {'n[' + 'a' * 198!r}… ({LONG + 2:,} characters): ",
    ),
    "node name": (f"nodes: [{{hosts: '{'n' * 300}'}}]\n", f"nodes[0].hosts: {'n' * 200!r}… (300 characters) (from "),
    "ssh user": (
        f"nodes: [{{hosts: n1, ssh: {{user: '{'u' * LONG}'}}}}]\n",
        f"nodes[0].ssh.user: Value error, {'u' * 200!r}… ({LONG:,} characters) is not a login name",
    ),
    "unknown key": (  # YAML caps a flow-mapping key at 1,024 characters
        f"nodes: [{{hosts: n1, '{'k' * 900} x': 1}}]\n",
        f"nodes[0].{'k' * 200!r}… (902 characters)",
    ),
    "profile name": (
        f"nodes: [{{hosts: n1, profile: '{'q' * LONG}'}}]\n",
        f"nodes[0].profile: profile {'q' * 200!r}… ({LONG:,} characters) is not defined",
    ),
}


@pytest.mark.parametrize("case", sorted(OVER_LONG))
def test_problems_quote_at_most_200_characters_of_a_value(tmp_path: Path, case: str) -> None:
    nodes, expected = OVER_LONG[case]
    path = tmp_path / "inventory.yaml"
    path.write_text(f"cluster: c\ndefaults: {{profile: p}}\n{nodes}profiles: {{p: {{}}}}\n")
    found = problems(path)
    assert any(p.startswith(expected) for p in found), found
    assert all(len(p) < 1_000 for p in found), [len(p) for p in found]


YAML_QUOTES = {
    "key given twice": (f"? '{'k' * LONG}'\n: 1\n? '{'k' * LONG}'\n: 2\n", f"key {'k' * 200!r}… ({LONG:,} characters)"),
    "undefined alias": (f"nodes: *{'a' * LONG}\n", f"found undefined alias {'a' * 200!r}… ({LONG:,} characters)"),
    "unknown tag": (
        f"nodes: !<tag:{'t' * LONG}> x\n",
        f"the tag {('tag:' + 't' * LONG)[:200]!r}… ({LONG + 4:,} characters)",
    ),
}


@pytest.mark.parametrize("case", sorted(YAML_QUOTES))
def test_yaml_errors_quote_at_most_200_characters_of_a_value(tmp_path: Path, case: str) -> None:
    text, expected = YAML_QUOTES[case]
    path = tmp_path / "inventory.yaml"
    path.write_text(f"cluster: c\n{text}")
    problem = only_problem(path)
    assert problem.startswith("not valid YAML: ") and expected in problem, problem
    assert len(problem) < 1_000


# The CLI: `inventory check` and `run` exit 2 with the problem ------------------------------------------------


CLI_CASES = {
    "cpu thresholds": ("{probes: {device: cpu}, thresholds: {gemm_bf16_tflops_min: 600}}", HEAD),
    "infinite threshold": ("{thresholds: {allreduce_inter_busbw_gbps_min: .inf}}", HEAD),
    "newline in cluster": ("{}", 'cluster: "c\\n# injected"\n' + HEAD.split("\n", 1)[1]),
    "long hostlist": ("{}", HEAD.replace("'n[1-2]'", f"'{'x' * LONG} y'")),
}
CLI_EXPECTED = {
    "cpu thresholds": f"profiles.p: Value error, thresholds gemm_bf16_tflops_min cannot be measured: {CPU_WHY}",
    "infinite threshold": "profiles.p.thresholds.allreduce_inter_busbw_gbps_min: Input should be a finite number",
    "newline in cluster": "cluster: Value error, holds '\\n' at position 1",
    "long hostlist": f"nodes[0].hosts: whitespace inside hostlist expression {'x' * 200!r}… ({LONG + 2:,} characters)",
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_inventory_check_exits_2_naming_the_key(tmp_path: Path, case: str) -> None:
    path = inventory(tmp_path, *CLI_CASES[case])
    result = CliRunner().invoke(app, ["inventory", "check", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{path}: {CLI_EXPECTED[case]}" in result.output
    assert "Traceback" not in result.output


@pytest.mark.integration
@pytest.mark.parametrize("case", ["cpu thresholds", "newline in cluster"])
def test_run_exits_2_before_touching_a_node(tmp_path: Path, case: str) -> None:
    path = inventory(tmp_path, *CLI_CASES[case])
    out = tmp_path / "out"
    proc = run_cli("run", "--inventory", str(path), "--out", str(out), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{path}: {CLI_EXPECTED[case]}" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
