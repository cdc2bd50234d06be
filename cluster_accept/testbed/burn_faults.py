"""Faults for the burn stage: a GPU that throttles under load, a GPU that flips a bit of its product, a DCGM
diagnostic that fails, a node without DCGM. Kept beside :mod:`testbed.faults`, which lists them in its plan."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt, StrictStr

from cluster_accept.testbed.fault_base import _Fault

GpuIndex = Annotated[StrictInt, Field(ge=0, le=63)]


class Throttle(_Fault):
    """Under load (while the burn samples it) one GPU's SM clock falls to ``sm_clock_mhz`` with ``reasons`` active
    (NVML's clock event bitmask; 0x40 is HW thermal slowdown); idle, it answers as before."""

    kind: Literal["throttle"] = "throttle"
    gpu: GpuIndex = 0
    sm_clock_mhz: Annotated[StrictInt, Field(ge=0, le=5000)] = 900
    reasons: Annotated[StrictStr, Field(pattern=r"^0x[0-9A-Fa-f]{1,16}$")] = "0x0000000000000040"


class HotGpu(_Fault):
    """Under load (while the burn samples it) one GPU runs at ``temp_c`` while its neighbours keep their
    temperature: a failing fan or a clogged heat sink."""

    kind: Literal["hot_gpu"] = "hot_gpu"
    gpu: GpuIndex = 0
    temp_c: Annotated[StrictInt, Field(ge=0, le=120)] = 85


class Cotenant(_Fault):
    """Another job's process on one GPU during the burn: nvidia-smi lists it on that GPU while the burn samples
    (``pid``, ``name``, ``used_memory_mib``), and from ``after_s`` into the burn that GPU's products take
    ``slowdown`` times as long (the two share the GPU), so its throughput drops half-way as a co-tenant's would."""

    kind: Literal["cotenant"] = "cotenant"
    gpu: GpuIndex = 0
    pid: Annotated[StrictInt, Field(ge=2, le=4194304)] = 4242
    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_./-]{1,64}$")] = "python"
    used_memory_mib: Annotated[StrictInt, Field(ge=0, le=1048576)] = 30000
    after_s: Annotated[float, Field(ge=0, le=3600)] = 2.0
    slowdown: Annotated[float, Field(ge=1, le=1000)] = 10.0


class SdcFlip(_Fault):
    """One bit of one GPU's product flipped (the burn's silent-data-corruption check must name that GPU)."""

    kind: Literal["sdc"] = "sdc"
    gpu: GpuIndex = 0


class DcgmFail(_Fault):
    """``dcgmi diag`` reports ``test`` failed on one GPU, with the error DCGM's plugin reports (pcie: link width,
    from level 2; nvbandwidth: memory copy utilisation, from level 3)."""

    kind: Literal["dcgm_fail"] = "dcgm_fail"
    test: Literal["pcie", "nvbandwidth"] = "pcie"
    gpu: GpuIndex = 0


class NoDcgm(_Fault):
    """The node has no ``dcgmi``."""

    kind: Literal["no_dcgm"] = "no_dcgm"
