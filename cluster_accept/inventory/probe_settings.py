"""A profile's ``probes`` block: how and where probes run, which collectives and rails they measure.

Kept apart from :mod:`inventory.model` (which re-exports it) so each stays small; the same strict rules apply:
an unknown key, a rail that names no NIC or interface, or a collective named twice is refused when loaded.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator

from cluster_accept.inventory.quoting import quoted
from cluster_accept.inventory.slurm_settings import SrunSettings

ALLOCATION_MARGIN_S = 180  # an allocation outlives its longest run by this: port step, start-up, kill grace


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # .inf and NaN are no setting


class ExpectedTransport(_Strict):
    intra_node: StrictStr | None = None
    inter_node: StrictStr | None = None


ExtraCollective = Literal["all_gather", "reduce_scatter", "all_to_all", "send_recv"]
DEFAULT_COLLECTIVES: tuple[ExtraCollective, ...] = ("all_gather", "reduce_scatter", "all_to_all")
# The bus-bandwidth metric each collective's figures carry, e.g. ``allgather_busbw_gbps``.
COLLECTIVE_METRICS = {op: op.replace("_", "") + "_busbw_gbps" for op in ("all_reduce", *get_args(ExtraCollective))}


def busbw_threshold(op: str, scope: str) -> str:
    """The profile threshold holding the minimum of collective ``op`` in ``scope`` (``intra`` or ``inter``):
    ``all_gather``, ``inter`` -> ``allgather_inter_busbw_gbps_min``."""
    return f"{op.replace('_', '')}_{scope}_busbw_gbps_min"


class Rail(_Strict):
    """One rail of a node: the GPU of that local index and the NIC it uses to reach the same GPU index on other
    nodes. A per-rail run puts one rank per node on this GPU with NCCL (or gloo) held to this NIC, so a slow NIC
    or cable is named as (node, rail)."""

    gpu: Annotated[int, Field(ge=0, le=63)]
    nic: StrictStr | None = Field(
        default=None, description="the HCA NCCL uses for this rail (NCCL_IB_HCA), e.g. mlx5_0"
    )
    ifname: StrictStr | None = Field(
        default=None, description="the network interface for this rail (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME)"
    )

    @property
    def name(self) -> str:
        return f"rail{self.gpu}"

    @field_validator("nic", "ifname")
    @classmethod
    def _one_word(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_.:=^-]{1,64}", value):
            raise ValueError(f"{quoted(value)} is not an interface or HCA name (letters, digits, '_', '.', ':', '-')")
        return value


class ProbeSettings(_Strict):
    python: StrictStr = "python3"
    device: Literal["cuda", "cpu"] = "cuda"
    expected_transport: ExpectedTransport = ExpectedTransport()
    command_prefix: StrictStr | None = Field(
        default=None, description="runs probes inside a container, e.g. 'docker exec trainer'"
    )
    timeout_s: Annotated[float, Field(gt=0, le=86400)] = 900.0
    rendezvous_timeout_s: Annotated[float, Field(ge=10, le=3600)] = Field(
        default=120.0, description="how long ranks wait for each other and for NCCL to initialise before failing"
    )
    allreduce_max_bytes: Annotated[int, Field(ge=1 << 20)] | None = None
    cuda_visible_devices: StrictStr | None = Field(
        default=None, description="probe only these GPUs (CUDA_VISIBLE_DEVICES), e.g. a partition of a node"
    )
    launcher: Literal["ssh", "slurm"] = Field(
        default="ssh", description="how multi-node runs start: torchrun over SSH on every node, or under srun"
    )
    slurm: SrunSettings = Field(default_factory=SrunSettings, description="the allocation and srun, for 'slurm'")
    max_parallel_nodes: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="probe at most this many nodes at once (shared power, storage, or cores)"
    )
    nccl_tests_all_reduce: StrictStr | None = Field(
        default=None, description="path of nccl-tests' all_reduce_perf on the node: used instead of torch"
    )
    collectives: list[ExtraCollective] = Field(
        default_factory=lambda: list(DEFAULT_COLLECTIVES),
        description="collectives measured beside all-reduce, in the node and across all nodes: all_gather and "
        "reduce_scatter (FSDP/ZeRO-3), all_to_all (mixture of experts), send_recv (pipeline parallelism)",
    )
    gpu_pairs: bool = Field(default=True, description="measure copy bandwidth between every ordered pair of GPUs")
    kept_settings: list[StrictStr] = Field(
        default_factory=list,
        description="variables of the job's environment set on purpose: never suspected of slowing a figure, never "
        "removed when one is measured again (NCCL keys pinned in nccl_env are kept too)",
    )
    prove_causes: bool = Field(
        default=True,
        description="measure a failed figure once more on its node without the settings suspected of slowing it "
        "(set in the job environment or NCCL's config files), to confirm or clear them",
    )
    prove_arms_extra: Annotated[int, Field(ge=0, le=64)] = Field(
        default=2,
        description="the bound of re-measurements a search for the cause of a slow figure may take over k "
        "suspects: 2*ceil(log2 k) + this for the first culprit, ceil(log2 k) + 2 more for each further one, "
        "2*ceil(log2 k) + 2 more for a set that slows it only together",
    )
    rails: list[Rail] = Field(
        default_factory=list,
        description="per-rail runs across nodes: one rank per node on each rail's GPU and NIC (empty: none)",
    )

    @property
    def tested_gpus(self) -> frozenset[int] | None:
        """The GPU indices ``cuda_visible_devices`` names, or None for the node's every GPU (unset, or GPUs named
        by UUID): a node partitioned on purpose (a host split into "nodes") answers for its own GPUs only."""
        if self.cuda_visible_devices is None:
            return None
        cells = [c.strip() for c in self.cuda_visible_devices.split(",") if c.strip()]
        return frozenset(int(c) for c in cells) if cells and all(c.isdigit() for c in cells) else None

    @model_validator(mode="after")
    def _allocation_outlasts_a_run(self) -> ProbeSettings:
        needed_s = self.timeout_s + ALLOCATION_MARGIN_S
        if self.launcher == "slurm" and self.slurm.time_limit_min * 60 < needed_s:
            raise ValueError(
                f"slurm.time_limit_min {self.slurm.time_limit_min} is shorter than timeout_s {self.timeout_s:g} "
                f"and {ALLOCATION_MARGIN_S} s for the port step, start-up and kill grace: Slurm would end the "
                f"allocation under a run still allowed to go on (give at least {math.ceil(needed_s / 60)})"
            )
        return self

    @field_validator("collectives")
    @classmethod
    def _collectives_once(cls, ops: list[str]) -> list[str]:
        twice = sorted({op for op in ops if ops.count(op) > 1})
        if twice:
            raise ValueError(f"named twice: {', '.join(twice)}")
        return ops

    @model_validator(mode="after")
    def _rails_can_run(self) -> ProbeSettings:
        gpus = [rail.gpu for rail in self.rails]
        twice = sorted({g for g in gpus if gpus.count(g) > 1})
        if twice:
            raise ValueError(f"rails: GPU {', '.join(map(str, twice))} named by more than one rail")
        if self.device == "cpu":
            lacking = [r.name for r in self.rails if r.ifname is None]
            if lacking:
                raise ValueError(f"rails {', '.join(lacking)}: on CPU (gloo) a rail needs its ifname")
        else:
            lacking = [r.name for r in self.rails if r.nic is None and r.ifname is None]
            if lacking:
                raise ValueError(f"rails {', '.join(lacking)}: name the rail's nic (NCCL_IB_HCA) or ifname")
        return self
