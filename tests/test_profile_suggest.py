"""``profile suggest``'s profile from parsed models of real captures: the majority, the disagreements marked,
ties left out, built-in bases shown, and text that always loads as a valid profile."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml

from cluster_accept.analysis.suggest import suggest_profile
from cluster_accept.checks import (
    cuda,
    driver,
    gpu_count,
    infiniband,
    nccl_env,
    nvlink,
    pcie,
    persistence,
    probe_python,
)
from cluster_accept.inventory.builtin import with_base
from cluster_accept.inventory.model import Profile
from tests.capture import DRIVER_FAILURE, captured, noheader

PARSERS: dict[str, Callable[[str, int | None], Any]] = {
    "gpu_count": gpu_count.parse,
    "driver": driver.parse,
    "cuda": cuda.parse,
    "persistence": persistence.parse,
    "nvlink": nvlink.parse,
    "pcie": pcie.parse,
    "nccl_env": nccl_env.parse,
    "probe": probe_python.parse,
    "infiniband": infiniband.parse,
}
TORCH = {"python": "3.12.3", "executable": "/usr/bin/python3", "torch": "2.11.0+cu130", "cuda_build": "13.0"}


def outputs(machine: str = "h200x4", env_extra: str = "", torch: dict[str, Any] | None = None) -> dict[str, str]:
    """What each check's command prints on ``machine``, built from its captures as the check tests do."""
    gpus, _ = captured(machine, "query-gpu-noheader.txt")
    proc, _ = captured(machine, "proc-driver-version.txt")
    smi, _ = captured(machine, "nvidia-smi.txt")
    env, _ = captured(machine, "env-nccl.txt")
    links, links_rc = captured(machine, "nvlink-s.txt")
    errors, _ = captured(machine, "nvlink-e.txt")
    versions = "".join(line.split(", ")[2] + "\n" for line in gpus.splitlines())
    nccl_version = next(line.split("=", 1)[1] for line in env.splitlines() if line.startswith("NCCL_VERSION="))
    head = "".join(line + "\n" for line in smi.rstrip("\n").split("\n")[:12])
    nccl_lines = "".join(line + "\n" for line in env.splitlines() if line.startswith("NCCL_"))
    info = {**TORCH, "cuda_available": True, "cuda_devices": 4, **(torch or {})}
    return {
        "gpu_count": gpus,
        "driver": versions + "### /proc/driver/nvidia/version rc=0\n" + proc,
        "cuda": head + f"### nccl nvidia-smi rc=0\nenv={nccl_version}\n",
        "persistence": noheader(machine, persistence.FIELDS),
        "nvlink": f"{links}### nvidia-smi nvlink -s rc={links_rc}\n{errors}",
        "pcie": noheader(machine, pcie.FIELDS),
        "nccl_env": f"### env\n{nccl_lines}{env_extra}### /etc/nccl.conf\n### ~/.nccl.conf\n### end\n",
        "probe": "CUDA Version: 13.0\n### probe-python found\n" + json.dumps(info) + "\n",
    }


def parsed(out: dict[str, str], exit_codes: dict[str, int] | None = None) -> dict[str, Any]:
    return {check: PARSERS[check](text, (exit_codes or {}).get(check, 0)) for check, text in out.items()}


def other_driver(out: dict[str, str]) -> dict[str, str]:
    return {**out, "driver": out["driver"].replace("580.159.04", "570.86.15")}


def gpu_lost(out: dict[str, str]) -> dict[str, str]:
    """GPU 3 fell off the bus: gone from every query."""
    return {**out, "gpu_count": "".join(out["gpu_count"].splitlines(keepends=True)[:3])}


def loaded(text: str) -> Profile:
    return Profile.model_validate(yaml.safe_load(text))


def cluster() -> dict[str, dict[str, Any]]:
    """node01 healthy, node02 with NCCL_DEBUG=INFO left on, node03 another driver, node04 one GPU short."""
    healthy = outputs()
    return {
        "node01": parsed(healthy),
        "node02": parsed(outputs(env_extra="NCCL_DEBUG=INFO\n")),
        "node03": parsed(other_driver(healthy)),
        "node04": parsed(gpu_lost(healthy)),
    }


def test_majority_with_disagreements_marked_over_the_built_in_base() -> None:
    text = suggest_profile(cluster(), {"node05": "unreachable: refused"}, None, "h200")
    lines = text.splitlines()
    assert "# not read: node05 (unreachable: refused)" in lines
    assert "base: h200-sxm  # the built-in profile of NVIDIA H200; the keys below win over its own" in lines
    # The base's thresholds are shown, so the operator sees the numbers the base brings.
    assert "#     gemm_bf16_tflops_min: 594.0" in lines
    assert "#     hbm_copy_gbps_min: 3840.0" in lines
    assert "#     allreduce_intra_busbw_gbps_min: 287.0" in lines
    i = lines.index("gpu:")
    assert lines[i + 1 : i + 3] == [
        '  model: "NVIDIA H200"  # 4 of 4 nodes: node[01-04]',
        "  count: 4  # 3 of 4 nodes; DISAGREE: 4 on node[01-03]; 3 on node04",
    ]
    assert (
        'driver_version: "580.159.04"  # 3 of 4 nodes; DISAGREE: 580.159.04 on node[01-02,04]; 570.86.15 on node03'
    ) in lines
    assert 'cuda_version: "13.0"  # 4 of 4 nodes: node[01-04]' in lines
    assert 'persistence_mode: "enabled"  # 4 of 4 nodes: node[01-04]' in lines
    assert "  links_per_gpu: 18  # 4 of 4 nodes: node[01-04]" in lines
    assert "  link_speed_gbps: 26.562  # 4 of 4 nodes: node[01-04]" in lines
    assert "  gen: 5  # 4 of 4 nodes: node[01-04]" in lines
    assert "  width: 16  # 4 of 4 nodes: node[01-04]" in lines
    # A variable set on one node only is a disagreement, never pinned.
    assert (
        "  # NCCL_DEBUG: not pinned, most nodes leave it unset: 3 of 4 nodes; DISAGREE: <unset> on node[01,03-04]; "
        "INFO on node02"
    ) in lines
    assert '  NCCL_NVLS_ENABLE: "0"  # 4 of 4 nodes: node[01-04]' in lines
    assert '  python: "/usr/bin/python3"  # 4 of 4 nodes: node[01-04]' in lines
    assert "  # the interpreter has torch 2.11.0+cu130, CUDA 13.0: 4 of 4 nodes: node[01-04]" in lines
    assert "  device: cuda  # probes run on the GPUs" in lines

    profile = loaded(text)
    assert profile.base == "h200-sxm"
    assert profile.nccl_env == {"NCCL_NVLS_ENABLE": "0"}  # NCCL_VERSION names a version, not a setting
    judged = with_base(profile)  # what the nodes are judged by: the base's thresholds, the nodes' values
    assert judged.gpu is not None and (judged.gpu.model, judged.gpu.count) == ("NVIDIA H200", 4)
    assert judged.driver_version == "580.159.04"
    assert judged.thresholds.gemm_bf16_tflops_min == 594.0
    assert judged.probes.expected_transport.intra_node == "P2P"


def test_cpu_device_has_no_base_and_no_gpu_thresholds() -> None:
    cpu_torch = {"torch": "2.13.0+cpu", "cuda_build": None}
    models = {f"node0{i}": parsed(outputs(torch=cpu_torch)) for i in (1, 2)}
    text = suggest_profile(models, {}, "cpu", "testbed")
    assert "base:" not in text and "tflops" not in text
    profile = loaded(text)
    assert profile.base is None
    assert (profile.probes.device, profile.probes.python) == ("cpu", "/usr/bin/python3")
    assert profile.thresholds.relative_verdict == "warn"
    assert profile.thresholds.gemm_bf16_tflops_min is None
    assert "  # the interpreter has torch 2.13.0+cpu, CPU build: 2 of 2 nodes: node[01-02]" in text.splitlines()
    # The same nodes on cuda: a CPU build of torch cannot probe the GPUs, and the profile says so.
    assert "probe:torch_no_cuda" in suggest_profile(models, {}, "cuda")


def test_a_tie_leaves_the_key_out_and_a_larger_group_wins() -> None:
    healthy = outputs()
    tie = {"node01": parsed(healthy), "node02": parsed(healthy)}
    tie |= {"node03": parsed(other_driver(healthy)), "node04": parsed(other_driver(healthy))}
    text = suggest_profile(tie)
    said = "nodes tie: 570.86.15 on node[03-04]; 580.159.04 on node[01-02]"
    assert f"# driver_version: left out, no value most nodes share: {said}" in text.splitlines()
    assert loaded(text).driver_version is None
    three = {**tie, "node04": parsed({**healthy, "driver": healthy["driver"].replace("580.159.04", "575.51.03")})}
    text = suggest_profile(three)
    assert loaded(text).driver_version == "580.159.04"
    assert "2 of 4 nodes; DISAGREE: 580.159.04 on node[01-02]; 570.86.15 on node03; 575.51.03 on node04" in text


def test_a_node_whose_nvidia_smi_fails_gives_no_value() -> None:
    healthy = outputs()
    dead = {**healthy, "gpu_count": DRIVER_FAILURE, "driver": DRIVER_FAILURE}
    models = {"node01": parsed(healthy), "node02": parsed(healthy), "node03": parsed(dead, {"gpu_count": 9})}
    text = suggest_profile(models)
    assert "  count: 4  # 2 of 3 nodes: node[01-02]; no value from node03" in text.splitlines()
    assert loaded(text).gpu == loaded(suggest_profile({"node01": parsed(healthy)})).gpu


def test_an_unknown_gpu_model_gets_placeholders_to_fill_in() -> None:
    out = outputs()
    renamed = {**out, "gpu_count": out["gpu_count"].replace("NVIDIA H200", "NVIDIA X300")}
    text = suggest_profile({"node01": parsed(renamed)}, {}, "cuda")
    assert "base:" not in text
    assert "# no built-in profile for 'NVIDIA X300': write a profile with gpu.model: 'NVIDIA X300'," in text
    assert "#   gemm_bf16_tflops_min: <fill in>            # bf16 GEMM per GPU, TFLOP/s" in text.splitlines()
    profile = loaded(text)
    assert profile.gpu is not None and profile.gpu.model == "NVIDIA X300"
    assert profile.thresholds.gemm_bf16_tflops_min is None


def test_a_single_h100_without_nvlink_expects_none_over_its_base() -> None:
    text = suggest_profile({"gpu1": parsed(outputs("h100x1"))})
    assert text.count("base: h100-sxm") == 1
    judged = with_base(loaded(text))
    assert judged.gpu is not None and judged.gpu.count == 1  # the node's one GPU, not the base's eight
    assert judged.nvlink is not None and judged.nvlink.links_per_gpu == 0
    assert "  links_per_gpu: 0  # 1 of 1 nodes: gpu1; the base has 18" in text.splitlines()


def test_node_text_stays_inside_its_value() -> None:
    """A value with quotes, a '#' and a control character is escaped: the profile loads with it intact."""
    odd = 'eth0 # "x"\x1b[2J'
    text = suggest_profile({"node01": parsed(outputs(env_extra=f"NCCL_SOCKET_IFNAME={odd}\n"))})
    assert loaded(text).nccl_env["NCCL_SOCKET_IFNAME"] == odd
    assert "\x1b" not in text
    assert '  NCCL_SOCKET_IFNAME: "eth0 # \\"x\\"\\u001b[2J"  # 1 of 1 nodes: node01' in text.splitlines()


def with_fabric(out: dict[str, str], ports: int = 8, rate: str = "400 Gb/sec (4X NDR)") -> dict[str, str]:
    """The node also shows ``ports`` InfiniBand HCA ports (the infiniband check's output)."""
    lines = "".join(
        f"/sys/class/infiniband/mlx5_{i}/ports/1 4: ACTIVE {rate} InfiniBand driver=mlx5_core\n" for i in range(ports)
    )
    return {**out, "infiniband": f"### ports\n{lines}### net\neno1 25000 up\n### peermem loaded\n### end\n"}


def test_the_fabric_between_nodes_is_written_as_auto_derives_it() -> None:
    nodes = {f"node0{i}": parsed(with_fabric(outputs())) for i in range(1, 4)}
    nodes["node04"] = parsed(with_fabric(outputs(), ports=7))
    text = suggest_profile(nodes, None, None, "ib")
    lines = text.splitlines()
    i = lines.index("infiniband:")
    assert lines[i + 1 : i + 5] == [
        "  ports: 8  # 3 of 4 nodes; DISAGREE: 8 on node[01-03]; 7 on node04",
        "  rate_gbps: 400.0  # 4 of 4 nodes: node[01-04]",
        '  width: "4X"  # 4 of 4 nodes: node[01-04]',
        "  peermem: true  # GPUDirect RDMA (nvidia_peermem or dma-buf); 4 of 4 nodes: node[01-04]",
    ]
    assert '    inter_node: "NET/IB"  # 4 of 4 nodes: node[01-04]' in lines
    assert (
        "  allreduce_inter_busbw_gbps_min: 200.0  # 3 of 4 nodes; DISAGREE: 200 on node[01-03]; 175 on node04" in lines
    )
    profile = loaded(text)
    assert profile.infiniband is not None and (profile.infiniband.ports, profile.infiniband.peermem) == (8, True)
    assert profile.probes.expected_transport.inter_node == "NET/IB"
    assert profile.thresholds.allreduce_inter_busbw_gbps_min == 200.0
