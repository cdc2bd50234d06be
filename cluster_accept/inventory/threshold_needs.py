"""What each threshold of a profile needs of its probes, and the thresholds a profile states that none of its
probes can measure.

A threshold promises that a row will judge it. One whose probe the profile switches off, or runs where that
figure is not measured, would pass ``inventory check``, run every probe and then reject every node
(``coverage:no_row``) or be answered with a skip on every node. Such a profile is refused when it loads, naming
each key and why, like every other inventory error.

:mod:`analysis.coverage` maps the same keys to the rows that judge them after a run; this module says what a
profile must let its probes do for such a row to exist. It sits beside the profile model because the inventory
is read without the analysis package (imports point from analysis to inventory, never back).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol, get_args

from cluster_accept.inventory.gpus import MODELS, profile_data
from cluster_accept.inventory.probe_settings import ExtraCollective, ProbeSettings, busbw_threshold
from cluster_accept.inventory.quoting import quoted


class Profile(Protocol):
    """What these rules read of a profile (:class:`inventory.model.Profile`, which validates itself with them,
    so they name the parts they read instead of importing it)."""

    @property
    def probes(self) -> ProbeSettings: ...
    @property
    def thresholds(self) -> Any: ...  # inventory.model.Thresholds
    @property
    def gpu(self) -> Any: ...  # inventory.model.GpuSpec | None
    @property
    def training(self) -> Any: ...  # inventory.model.TrainingSettings
    @property
    def burn(self) -> Any: ...  # inventory.burn_settings.BurnSettings


# Figures only the GPU probes produce. With probes.device: cpu the bench reports GEMM in GFLOP/s and host memory
# copy under names of their own (gemm_fp32_gflops, mem_copy_gbps), the GPU pair copies do not run, and MFU needs
# a GPU's dense peak (the training probe answers it with a skip).
NEEDS_CUDA: tuple[str, ...] = (
    "gemm_bf16_tflops_min",
    "gemm_fp16_tflops_min",
    "gemm_tf32_tflops_min",
    "gemm_fp8_tflops_min",
    "hbm_copy_gbps_min",
    "h2d_gbps_min",
    "d2h_gbps_min",
    "burn_tflops_min",
    "gpu_pair_copy_gbps_min",
    "training_mfu_min",
)
# Figures only the CPU path produces (probes.device: cpu): GEMM in GFLOP/s, host memory copy, a CPU burn.
NEEDS_CPU: tuple[str, ...] = ("gemm_fp32_gflops_min", "gemm_bf16_gflops_min", "mem_copy_gbps_min", "burn_gflops_min")
# The burn's figures: measured only where the profile gives the burn minutes in some suite.
BURN_FIGURES: tuple[str, ...] = ("burn_tflops_min", "burn_gflops_min")
# Figures measured between the GPUs of one node: a node probed on one GPU answers them with a skip. On CPU the
# intra-node collectives run on two gloo ranks whatever the node's GPU count, so this holds on CUDA only.
NEEDS_TWO_GPUS: tuple[str, ...] = (
    "allreduce_intra_busbw_gbps_min",
    *(busbw_threshold(op, "intra") for op in get_args(ExtraCollective)),
    "gpu_pair_copy_gbps_min",
)
# Floors a built-in GPU profile brings (:func:`inventory.gpus.profile_data`): each a fraction of the GPU's
# datasheet, the all-reduce minimum among them a fraction of NVLink's bandwidth. On CPU none of them is what the
# probes measure (gloo's all-reduce between two processes on one node moves through host memory, not NVLink):
# taken from a base, they are unmeasurable there like the figures only a GPU produces.
GPU_DATASHEET_FLOORS: frozenset[str] = frozenset(key for model in MODELS for key in profile_data(model)["thresholds"])
# Validation context keys: a profile merged over a built-in base is told which thresholds came from the base,
# so that a problem with one says where it came from and how to leave it out.
BASE = "base"
INHERITED = "inherited"
CUDA_WHY = (
    "probes.device is cuda: they are what the bench and the burn report on a node probed on CPU; on GPUs write "
    "gemm_*_tflops_min, hbm_copy_gbps_min and burn_tflops_min"
)
CPU_WHY = (
    "probes.device is cpu: the GPU probes do not run (on CPU the bench reports GEMM in GFLOP/s and host memory "
    "copy, and measures no GPU pair copy and no MFU; a built-in profile's floors are its GPU's, its all-reduce "
    "minimum NVLink's, not what gloo moves between processes); leave them out, or probe with device cuda"
)


def stated(profile: Profile) -> list[str]:
    """The thresholds ``profile`` sets, in the model's order."""
    return [key for key, value in profile.thresholds.model_dump().items() if value is not None]


def _probed_gpus(profile: Profile) -> tuple[int, str] | None:
    """How many GPUs of a node the probes run on, and the key that says so; None when the profile leaves it to
    the cluster's majority."""
    devices = profile.probes.cuda_visible_devices
    if devices is not None:
        count = len([d for d in devices.split(",") if d.strip()])
        return count, f"probes.cuda_visible_devices {quoted(devices)} names {count} GPU{'' if count == 1 else 's'}"
    if profile.gpu is not None and profile.gpu.count is not None:
        return profile.gpu.count, f"gpu.count is {profile.gpu.count}"
    return None


def unmeasurable(profile: Profile, inherited: Collection[str] = ()) -> list[tuple[list[str], str]]:
    """(keys, why) for the thresholds ``profile`` sets that no probe of it can measure: on CPU, the figures only
    a GPU produces and every floor a built-in GPU profile brought (``inherited``: the keys taken from a base,
    :data:`GPU_DATASHEET_FLOORS`); on CUDA, the figures only the CPU path produces; figures between a node's
    GPUs where the probes run on one GPU. One rule for every built-in profile, whichever floors its model has."""
    keys = stated(profile)
    found: list[tuple[list[str], str]] = []
    if profile.probes.device == "cpu":
        on_gpu = [k for k in keys if k in NEEDS_CUDA or (k in inherited and k in GPU_DATASHEET_FLOORS)]
        if on_gpu:
            found.append((on_gpu, CPU_WHY))
        return found
    on_cpu = [k for k in keys if k in NEEDS_CPU]
    if on_cpu:
        found.append((on_cpu, CUDA_WHY))
    gpus = _probed_gpus(profile)
    between = [k for k in keys if k in NEEDS_TWO_GPUS]
    if gpus is not None and gpus[0] < 2 and between:
        found.append((between, f"{gpus[1]}: they are measured between the GPUs of one node, and need two"))
    return found


def switched_off(profile: Profile) -> list[str]:
    """Thresholds whose probe the profile switches off: a collective it does not list, all-reduce by nccl-tests
    beside other collectives in the node, GPU pairs or rails it does not measure, a burn of no minutes in any
    suite, training it disables."""
    thresholds, probes = profile.thresholds, profile.probes
    problems = []
    measured = set(probes.collectives)
    named = [
        busbw_threshold(op, scope)
        for op in get_args(ExtraCollective)
        if op not in measured
        for scope in ("intra", "inter")
        if getattr(thresholds, busbw_threshold(op, scope)) is not None
    ]
    if named:
        problems.append(f"thresholds {', '.join(named)} name a collective not in probes.collectives")
    if probes.nccl_tests_all_reduce:
        named = [
            busbw_threshold(op, "intra")
            for op in get_args(ExtraCollective)
            if getattr(thresholds, busbw_threshold(op, "intra")) is not None
        ]
        if named:
            problems.append(
                f"thresholds {', '.join(named)}: probes.nccl_tests_all_reduce measures all-reduce only inside the "
                "node; leave them out or drop nccl_tests_all_reduce"
            )
    if thresholds.gpu_pair_copy_gbps_min is not None and not probes.gpu_pairs:
        problems.append("thresholds gpu_pair_copy_gbps_min needs probes.gpu_pairs: true")
    burn = [k for k in BURN_FIGURES if getattr(thresholds, k) is not None]
    if burn and profile.burn.minutes <= 0 and profile.burn.light_minutes <= 0:
        problems.append(f"thresholds {', '.join(burn)} need the burn: burn.minutes and burn.light_minutes are 0")
    if thresholds.rail_busbw_gbps_min is not None and not probes.rails:
        problems.append("thresholds rail_busbw_gbps_min needs probes.rails")
    training = [k for k in stated(profile) if k.startswith("training_")]
    if training and not profile.training.enabled:
        problems.append(f"thresholds {', '.join(training)} need the training probe: training.enabled is false")
    return problems


def _named(keys: list[str], inherited: Collection[str], base: str) -> str:
    """``thresholds a, b``, those taken from a built-in base said so, with how to leave them out."""
    own = [k for k in keys if k not in inherited]
    taken = [k for k in keys if k in inherited]
    parts = [", ".join(own)] if own else []
    if taken:
        parts.append(f"{', '.join(taken)} (from {base}; write them as null under thresholds to leave them out)")
    return "thresholds " + " and ".join(parts)


def threshold_problems(profile: Profile, context: object = None) -> list[str]:
    """Every threshold of ``profile`` no probe of it would judge, one problem per cause. ``context`` is the
    validation context: a mapping with :data:`BASE` and :data:`INHERITED` when ``profile`` is a profile merged
    over a built-in one."""
    given: Mapping[str, object] = context if isinstance(context, Mapping) else {}
    inherited = given.get(INHERITED)
    taken = inherited if isinstance(inherited, (set, frozenset, tuple, list)) else ()
    base = str(given.get(BASE) or "the base")
    problems = switched_off(profile)
    found = unmeasurable(profile, taken)
    problems += [f"{_named(keys, taken, base)} cannot be measured: {why}" for keys, why in found]
    return problems
