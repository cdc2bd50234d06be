"""Built-in GPU profiles: what operators buy, from NVIDIA's datasheets, with thresholds as fractions of peak.

"What is a good number?" is the question every operator asks first; the answer here is the datasheet's peak
times a fraction calibrated on what the probes measured on real machines (``bench/results/``,
``../shared/captures/*/refbench.json``). An inventory names a built-in profile (``profile: h100-sxm``), lets
preflight pick it from the GPU model nvidia-smi prints (``profile: auto``), or starts from one and overrides
any key (``base: h100-sxm`` or ``base: auto`` in its own profile).

Peaks are dense (no 2:4 sparsity), TFLOP/s, for the SXM/board power the datasheet states. Memory bandwidth is
the datasheet's, GB/s. NVLink: links per GPU and the per-link, per-direction speed as ``nvidia-smi nvlink -s``
prints it (``26.562 GB/s`` for NVLink 4), so the check compares like with like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Fractions of peak a healthy GPU reaches in the probes, with the margin a threshold needs:
# - GEMM bf16/fp16 8192³, every GPU loaded at once: 641-775 TFLOP/s on H100 SXM / H200 (0.65-0.78 of 989.4;
#   refbench 670-692 at 8192³). 0.60 leaves 7 % under the lowest healthy figure.
GEMM_16BIT_FRACTION = 0.60
# - tf32: 347-374 TFLOP/s of 494.7 (0.70-0.76).
GEMM_TF32_FRACTION = 0.60
# - fp8 (torch._scaled_mm): 1,205-1,420 TFLOP/s of 1,978.9 (0.61-0.72).
GEMM_FP8_FRACTION = 0.50
# - HBM copy (read + write): 3,028 GB/s of 3,350 on H100 SXM (0.90), 4,223-4,273 of 4,800 on H200 (0.88-0.89).
HBM_FRACTION = 0.80
# - intra-node all-reduce bus bandwidth at 1 GiB over NVLink: 355.6-362 GB/s on 4 x H200 against 450 GB/s per
#   direction (0.79-0.80); 8-GPU boards reach about the same through NVSwitch. Judged only where NVLink is.
ALLREDUCE_NVLINK_FRACTION = 0.60
# The other figures' default floors (collectives, GPU-pair copies, host<->device, the burn) are fractions of the
# same datasheet figures, declared by each probe beside its rules (``MetricRule.default``) with the measurements
# they were calibrated on, and applied when the figure is judged.

# PCIe per lane and direction, GB/s, after line coding (8b/10b to Gen2, 128b/130b from Gen3, FLIT from Gen6):
# a Gen5 x16 link moves about 63 GB/s each way.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563, 7: 15.125}


@dataclass(frozen=True)
class GpuModel:
    """One GPU product as a datasheet describes it, and the name ``nvidia-smi --query-gpu=name`` prints."""

    key: str  # the built-in profile's name
    smi_name: str  # exactly as nvidia-smi prints it
    bf16_tflops: float
    fp16_tflops: float
    tf32_tflops: float
    fp8_tflops: float | None  # None: no fp8 tensor cores
    memory_gbps: float
    nvlink_links: int  # per GPU; 0: none (PCIe card without a bridge)
    nvlink_link_gbps: float  # per link, per direction, as nvidia-smi prints it
    pcie_gen: int | None  # None: the GPU does not hang off PCIe (NVLink-C2C to the CPU)
    pcie_width: int
    gpus_per_node: int | None  # None: boards or servers differ (4- and 8-GPU HGX); the cluster's majority
    source: str
    nvlink_bridged: bool = False  # NVLink bridges join pairs or small groups only, not every GPU of the node
    # per direction, GB/s, where the GPU reaches its CPU otherwise than over PCIe (GB200: NVLink-C2C)
    host_link: tuple[str, float] | None = None

    @property
    def nvlink_gbps(self) -> float:
        """Per GPU, per direction: what a ring all-reduce's bus bandwidth can approach."""
        return self.nvlink_links * self.nvlink_link_gbps

    @property
    def pcie_gbps(self) -> float | None:
        """The GPU's PCIe link, per direction (None: it has none to the host)."""
        return None if self.pcie_gen is None else PCIE_LANE_GBPS[self.pcie_gen] * self.pcie_width


@dataclass(frozen=True)
class Rating:
    """One datasheet figure of a GPU model that a default floor is a fraction of: ``NVLink 478 GB/s``."""

    name: str
    value: float
    unit: str = "GB/s"

    def __str__(self) -> str:
        return f"{self.name} {self.value:,.0f} {self.unit}"


def nvlink_rating(model: GpuModel) -> Rating | None:
    """NVLink per GPU and direction where it joins every GPU of the node (an HGX board, a GB200 tray); None on
    PCIe cards and on NVL cards, whose bridges join pairs or groups of four (the rest cross PCIe)."""
    if not model.nvlink_links or model.nvlink_bridged:
        return None
    return Rating("NVLink", model.nvlink_gbps)


def pcie_rating(model: GpuModel) -> Rating | None:
    """The GPU's PCIe link per direction (``PCIe Gen5 x16 63 GB/s``); None where it has none to the host."""
    gbps = model.pcie_gbps
    return None if gbps is None else Rating(f"PCIe Gen{model.pcie_gen} x{model.pcie_width}", gbps)


def host_rating(model: GpuModel) -> Rating | None:
    """The GPU's link to its host's memory per direction: NVLink-C2C on GB200, PCIe elsewhere."""
    if model.host_link is not None:
        return Rating(*model.host_link)
    return pcie_rating(model)


def bf16_rating(model: GpuModel) -> Rating:
    """The dense bf16 tensor-core peak."""
    return Rating("bf16 peak", model.bf16_tflops, "TFLOP/s")


# Sources (each figure below comes from the datasheet named in its ``source``):
#   A100: "NVIDIA A100 Tensor Core GPU" datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
#         nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): bf16/fp16 312, tf32 156 (dense), HBM2 1,555 GB/s
#         (40 GB), HBM2e 2,039 GB/s (80 GB), NVLink 3 600 GB/s (12 links x 25 GB/s per direction), PCIe Gen4.
#   H100 / H100 NVL: "NVIDIA H100 Tensor Core GPU" datasheet (resources.nvidia.com/en-us-tensor-core/
#         nvidia-tensor-core-gpu-datasheet): SXM bf16 1,979 / fp8 3,958 / tf32 989 with sparsity (halved here),
#         3.35 TB/s, NVLink 900 GB/s (18 links), PCIe Gen5 x16; NVL bf16 1,671 / fp8 3,341 / tf32 835 sparse,
#         3.9 TB/s, NVLink bridge 600 GB/s; PCIe card 1,513 / 3,026 / 756 sparse, 2 TB/s (the card's
#         original datasheet: bf16 756 dense).
#   H200: "NVIDIA H200 Tensor Core GPU" datasheet (nvidia.com/en-us/data-center/h200): SXM as H100 SXM with
#         4.8 TB/s; NVL bf16 1,671 / fp8 3,341 / tf32 835 sparse, 4.8 TB/s, NVLink bridge 900 GB/s.
#   B200 / GB200: "NVIDIA Blackwell" datasheets (HGX B200: nvidia.com/en-us/data-center/hgx; GB200 NVL72:
#         nvidia.com/en-us/data-center/gb200-nvl72): per GPU bf16 4.5 / 5 PFLOP/s, fp8 9 / 10, tf32 2.2 / 2.5
#         with sparsity (halved here), HBM3e 8 TB/s, NVLink 5 1.8 TB/s (18 links x 50 GB/s per direction, a
#         minimum: the check passes any link at or above it); the HGX B200 board is PCIe Gen5 x16 to the host,
#         GB200 reaches its Grace CPU over NVLink-C2C (900 GB/s both ways: 450 per direction).
# Calibration: the fractions below were measured on Hopper (H100 SXM, H200) only; on A100, B200, GB200 and L40S
# they are the same fractions of those datasheets' peaks, not yet checked against a measurement there.
#   L40S: "NVIDIA L40S" datasheet (nvidia.com/en-us/data-center/l40s): bf16/fp16 733, fp8 1,466, tf32 366 with
#         sparsity (halved here), GDDR6 864 GB/s, PCIe Gen4 x16, no NVLink.
MODELS: tuple[GpuModel, ...] = (
    GpuModel("a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", 312.0, 312.0, 156.0, None, 1555.0, 12, 25.0, 4, 16, None,
             "A100 datasheet (SXM4 40GB)"),
    GpuModel("a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB", 312.0, 312.0, 156.0, None, 2039.0, 12, 25.0, 4, 16, None,
             "A100 datasheet (SXM4 80GB)"),
    GpuModel("h100-sxm", "NVIDIA H100 80GB HBM3", 989.4, 989.4, 494.7, 1978.9, 3350.0, 18, 26.562, 5, 16, None,
             "H100 datasheet (SXM)"),
    GpuModel("h100-pcie", "NVIDIA H100 PCIe", 756.0, 756.0, 378.0, 1513.0, 2000.0, 0, 26.562, 5, 16, None,
             "H100 datasheet (PCIe)"),
    GpuModel("h100-nvl", "NVIDIA H100 NVL", 835.5, 835.5, 417.5, 1670.5, 3900.0, 12, 26.562, 5, 16, None,
             "H100 datasheet (NVL)", nvlink_bridged=True),
    GpuModel("h200-sxm", "NVIDIA H200", 989.4, 989.4, 494.7, 1978.9, 4800.0, 18, 26.562, 5, 16, None,
             "H200 datasheet (SXM)"),
    GpuModel("h200-nvl", "NVIDIA H200 NVL", 835.5, 835.5, 417.5, 1670.5, 4800.0, 18, 26.562, 5, 16, None,
             "H200 datasheet (NVL)", nvlink_bridged=True),
    GpuModel("b200", "NVIDIA B200", 2250.0, 2250.0, 1125.0, 4500.0, 8000.0, 18, 50.0, 5, 16, 8,
             "HGX B200 datasheet (8-GPU boards only)"),
    GpuModel("gb200", "NVIDIA GB200", 2500.0, 2500.0, 1250.0, 5000.0, 8000.0, 18, 50.0, None, 16, 4,
             "GB200 NVL72 datasheet (per GPU; 4 GPUs per compute tray)", host_link=("NVLink-C2C", 450.0)),
    GpuModel("l40s", "NVIDIA L40S", 362.05, 362.05, 183.0, 733.0, 864.0, 0, 0.0, 4, 16, None,
             "L40S datasheet"),
)  # fmt: skip
BY_KEY = {model.key: model for model in MODELS}
AUTO = "auto"


def model_for_name(smi_name: str) -> GpuModel | None:
    """The built-in model whose nvidia-smi name is ``smi_name`` (exact, whitespace trimmed); None if unknown."""
    wanted = " ".join(smi_name.split())
    for model in MODELS:
        if model.smi_name == wanted:
            return model
    return None


def _round(value: float) -> float:
    return float(round(value))


def profile_data(model: GpuModel) -> dict[str, Any]:
    """The built-in profile of ``model`` as inventory keys: what a healthy node of that model meets."""
    gpu: dict[str, Any] = {"model": model.smi_name}
    if model.gpus_per_node is not None:
        gpu["count"] = model.gpus_per_node
    thresholds: dict[str, Any] = {
        "gemm_bf16_tflops_min": _round(model.bf16_tflops * GEMM_16BIT_FRACTION),
        "gemm_fp16_tflops_min": _round(model.fp16_tflops * GEMM_16BIT_FRACTION),
        "gemm_tf32_tflops_min": _round(model.tf32_tflops * GEMM_TF32_FRACTION),
        "hbm_copy_gbps_min": _round(model.memory_gbps * HBM_FRACTION),
    }
    if model.fp8_tflops is not None:
        thresholds["gemm_fp8_tflops_min"] = _round(model.fp8_tflops * GEMM_FP8_FRACTION)
    data: dict[str, Any] = {"gpu": gpu, "persistence_mode": "enabled"}
    if model.nvlink_links:
        data["nvlink"] = {"links_per_gpu": model.nvlink_links, "link_speed_gbps": model.nvlink_link_gbps}
    if model.nvlink_links and not model.nvlink_bridged and model.pcie_gen is not None:
        # SXM on an HGX board: NVSwitches and Fabric Manager where the board has them (4-GPU boards and VM slices
        # show none: the check tells them apart); GB200's switches are in the rack's switch trays
        data["nvswitch"] = {}
    if model.nvlink_links and not model.nvlink_bridged:  # bridged pairs: a node-wide all-reduce crosses PCIe
        thresholds["allreduce_intra_busbw_gbps_min"] = _round(model.nvlink_gbps * ALLREDUCE_NVLINK_FRACTION)
        # NVLink peers: NCCL's P2P transport (P2P/CUMEM or P2P/IPC); SHM means P2P was disabled or refused.
        data["probes"] = {"expected_transport": {"intra_node": "P2P"}}
    if model.pcie_gen is not None:
        data["pcie"] = {"gen": model.pcie_gen, "width": model.pcie_width}
    data["thresholds"] = thresholds
    return data


def unknown_model_help(smi_name: str) -> str:
    """What to write when ``profile: auto`` meets a GPU no built-in profile describes."""
    known = ", ".join(f"{m.key} ({m.smi_name})" for m in MODELS)
    return (
        f"no built-in profile for {smi_name!r}: write a profile with gpu.model: {smi_name!r}, gpu.count, nvlink "
        "(links_per_gpu, link_speed_gbps) or none, pcie (gen, width), and thresholds gemm_bf16_tflops_min, "
        f"hbm_copy_gbps_min, allreduce_intra_busbw_gbps_min; built-in: {known}"
    )
