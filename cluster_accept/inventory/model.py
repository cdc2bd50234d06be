"""Typed inventory: the file as an operator writes it (``*File`` models) and the resolved nodes.

Every model forbids unknown keys, so a typo (``comand_timeout_s``) is an error naming the key, never ignored.
Units are in the key names. Values YAML would turn into numbers losing digits must be strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cluster_accept.inventory.burn_settings import BurnSettings
from cluster_accept.inventory.probe_settings import (  # noqa: F401 - part of the profile model
    COLLECTIVE_METRICS,
    ExpectedTransport,
    ExtraCollective,
    ProbeSettings,
    Rail,
    busbw_threshold,
)
from cluster_accept.inventory.quoting import one_line, quoted
from cluster_accept.inventory.shapes import PRESETS, ModelShape, default_preset
from cluster_accept.inventory.simulation_settings import SimulatedAs, SimulationSettings
from cluster_accept.inventory.slurm_settings import SlurmSettings
from cluster_accept.inventory.threshold_needs import threshold_problems


class _Strict(BaseModel):
    # A minimum of .inf is one no node reaches, NaN compares false with every figure: a number is finite or refused.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# A name the reports and terminals print: a profile, a label's key and value.
Name = Annotated[StrictStr, AfterValidator(one_line)]
# The cluster's name is also a folder of the history (``HISTORY/calibration/<cluster>/``): a name that could be
# read as a path (``../../x``, ``/etc``, ``.``) would put what is written there anywhere, so it is one path part
# of letters, digits, '_', '.' and '-', starting with a letter, a digit or '_' (never '.': no hidden or parent
# folder, never '-': no option to a command it is handed to).
_PATH_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def path_part(name: str) -> str:
    """``name`` when it can only be one folder's name; ValueError saying what is allowed."""
    if not _PATH_PART.fullmatch(name):
        raise ValueError(
            f"{quoted(name)} is no name for a folder of the history: use 1 to 128 letters, digits, '_', '.' or '-', "
            "starting with a letter, a digit or '_'"
        )
    return name


ClusterName = Annotated[StrictStr, AfterValidator(one_line), AfterValidator(path_part)]  # one line, then one folder


PositiveSeconds = Annotated[float, Field(gt=0, le=86400)]
# Where to connect: a host name or an IPv4/IPv6 address. Connection hosts are expanded into the operator's
# ssh_config (``%h`` in ``Match exec``, run by a shell), so shell metacharacters and a leading '-' are refused.
_HOST = r"[A-Za-z0-9_:][A-Za-z0-9._:-]{0,252}"
_ADDRESS = re.compile(_HOST)
_JUMP = re.compile(rf"(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?{_HOST}")
# A login name as sshd and NSS accept them (POSIX names, dots, '@' of directory users, a trailing '$'): never
# whitespace, quotes or shell metacharacters, never a leading '-' (an option to ssh).
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@-]{0,63}\$?")
Port = Annotated[int, Field(ge=1, le=65535)]
HostKeyPolicy = Literal["strict", "accept-new"]


class SshSettings(_Strict):
    """How to reach a node. Unset keys fall back to the defaults, then to ~/.ssh/config, then to ssh's own."""

    user: StrictStr | None = None
    port: Port | None = None
    identity_file: StrictStr | None = None
    jump: StrictStr | None = Field(default=None, description="ProxyJump host: host, user@host or user@host:port")
    known_hosts: StrictStr | None = None
    host_key_policy: HostKeyPolicy | None = None
    connect_timeout_s: PositiveSeconds | None = None
    command_timeout_s: PositiveSeconds | None = None

    @field_validator("jump")
    @classmethod
    def _jump_is_a_host(cls, jump: str | None) -> str | None:
        if jump is not None and not _JUMP.fullmatch(jump):
            raise ValueError("not [user@]host[:port]: use letters, digits, '.', '-', '_' (':' for a port or IPv6)")
        if jump is not None:
            parse_jump(jump)
        return jump

    @field_validator("user")
    @classmethod
    def _user_is_a_login(cls, user: str | None) -> str | None:
        if user is not None and not _USER.fullmatch(user):
            raise ValueError(
                f"{quoted(user)} is not a login name: letters, digits, '.', '_', '-', '@' (a trailing '$'), not "
                "starting with '-', at most 64 characters"
            )
        return user

    @field_validator("identity_file", "known_hosts")
    @classmethod
    def _path_is_written(cls, path: str | None) -> str | None:
        if path is not None and (not path.strip() or "\0" in path or path != path.strip()):
            raise ValueError("an empty path, or one with surrounding spaces or a NUL character")
        return path

    def merged_over(self, base: SshSettings) -> SshSettings:
        """These settings, with unset keys taken from ``base``."""
        values = base.model_dump()
        values.update({k: v for k, v in self.model_dump().items() if v is not None})
        return SshSettings(**values)


def parse_jump(jump: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` → (user, host, port); raises ValueError naming what is wrong (an IPv6 address,
    several ':', has no port)."""
    user, _, hostport = jump.rpartition("@")
    if "@" in jump and not user:
        raise ValueError(f"jump host {quoted(jump)}: empty user before '@'")
    host, port = hostport, None
    if hostport.count(":") == 1:
        host, port_text = hostport.split(":")
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"jump host {quoted(jump)}: port {quoted(port_text)} is not a number from 1 to 65535")
        port = int(port_text)
    if not host:
        raise ValueError(f"jump host {quoted(jump)}: no host name")
    return user or None, host, port


class MinVersion(_Strict):
    # numbers and dots only: a minimum with no number in it would compare below every version and pass them all
    min: Annotated[StrictStr, Field(pattern=r"^\d{1,9}(\.\d{1,9}){0,3}$", description="e.g. 570 or 580.95.05")]


class GpuSpec(_Strict):
    model: StrictStr | None = Field(default=None, description="as nvidia-smi prints it; left out: not checked")
    count: Annotated[int, Field(ge=1, le=64)] | None = Field(
        default=None, description="GPUs per node; left out: the cluster's majority is expected"
    )


class NvlinkSpec(_Strict):
    links_per_gpu: Annotated[int, Field(ge=0, le=64)]
    link_speed_gbps: Annotated[float, Field(gt=0)]


class NvswitchSpec(_Strict):
    """The node's GPUs are NVSwitch-connected (an HGX board): its NVSwitches, Fabric Manager and each GPU's fabric
    state are checked (checks.nvswitch)."""

    count: Annotated[int, Field(ge=1, le=64)] | None = Field(
        default=None, description="NVSwitches per node; left out: the cluster's majority (boards differ)"
    )


class FirmwareSpec(_Strict):
    """Firmware versions the cluster pins (checks.firmware); a version left out is compared with the cluster's
    majority only."""

    vbios: StrictStr | None = Field(default=None, description="GPU VBIOS, as nvidia-smi prints vbios_version")
    inforom: StrictStr | None = Field(default=None, description="InfoROM image, as nvidia-smi prints inforom.img")
    hca_fw: StrictStr | None = Field(default=None, description="HCA firmware, as sysfs fw_ver reads")
    ofed: StrictStr | None = Field(default=None, description="the NIC driver stack, as ofed_info -s prints it")


class PcieSpec(_Strict):
    gen: Annotated[int, Field(ge=1, le=7)]
    width: Literal[1, 2, 4, 8, 16, 32]


class InfinibandSpec(_Strict):
    """The HCA ports every node must show active, at this rate and width (``400 Gb/sec (4X NDR)``)."""

    ports: Annotated[int, Field(ge=1, le=64)] | None = None
    rate_gbps: Annotated[float, Field(gt=0)] | None = None
    width: Literal["1X", "2X", "4X", "8X", "12X"] | None = None
    # GPUDirect RDMA: true (or left out) requires nvidia_peermem, or dma-buf (the open kernel module on Linux 5.12+);
    # false records it only, for nodes that do without GPUDirect
    peermem: bool | None = None


TrainingPreset = Literal["tiny", "125m", "350m", "1.3b"]
Count = Annotated[int, Field(ge=1)]


class TrainingSettings(_Strict):
    """The training-step probe: a GPT-style decoder trained on synthetic tokens on every GPU of a node, then
    across 1, 2, 4 … nodes. A dimension left out comes from the preset; the preset left out is ``tiny`` on
    CPU, ``125m`` for the light suite and ``350m`` otherwise (``1.3b`` when named)."""

    enabled: bool = True
    preset: TrainingPreset | None = None
    layers: Annotated[int, Field(ge=1, le=512)] | None = None
    width: Annotated[int, Field(ge=8, le=65536)] | None = None
    heads: Annotated[int, Field(ge=1, le=1024)] | None = None
    seq_len: Annotated[int, Field(ge=8, le=1 << 20)] | None = None
    micro_batch: Annotated[int, Field(ge=1, le=4096)] | None = None
    vocab: Annotated[int, Field(ge=2, le=1 << 22)] | None = None
    parallel: Literal["ddp", "fsdp"] = Field(
        default="ddp", description="data parallel (DDP), or fully sharded (torch.distributed.fsdp.fully_shard)"
    )
    compile: bool = Field(default=False, description="torch.compile the model (the first steps compile it)")
    warmup_steps: Annotated[int, Field(ge=1, le=1000)] = 5
    steps: Annotated[int, Field(ge=3, le=10000)] = 20
    peak_tflops: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="the GPU's dense bf16 peak for MFU, when its name is not in the built-in table"
    )

    def shape(self, device: str, quick: bool) -> ModelShape:
        """The model this profile trains: the preset's dimensions with the profile's own over them."""
        preset = PRESETS[self.preset or default_preset(device, quick)]
        own = {k: getattr(self, k) for k in ("layers", "width", "heads", "seq_len", "micro_batch", "vocab")}
        return replace(preset, **{k: v for k, v in own.items() if v is not None})

    def shape_problem(self, device: str) -> str | None:
        """Why the model this profile trains on ``device`` cannot be built (either suite); None when it can."""
        for quick in (False, True):
            shape = self.shape(device, quick)
            if shape.width % shape.heads:
                preset = self.preset or default_preset(device, quick)
                said = f"(preset {preset} with these dimensions)"
                return f"width {shape.width} is not a multiple of heads {shape.heads} {said}"
        return None


class Thresholds(_Strict):
    gemm_bf16_tflops_min: Annotated[float, Field(ge=0)] | None = None
    gemm_fp16_tflops_min: Annotated[float, Field(ge=0)] | None = None
    gemm_tf32_tflops_min: Annotated[float, Field(ge=0)] | None = None
    gemm_fp8_tflops_min: Annotated[float, Field(ge=0)] | None = None
    hbm_copy_gbps_min: Annotated[float, Field(ge=0)] | None = None
    h2d_gbps_min: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="pinned host-to-device copy bandwidth of each GPU, one GPU at a time"
    )
    d2h_gbps_min: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="pinned device-to-host copy bandwidth of each GPU, one GPU at a time"
    )
    burn_tflops_min: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="each GPU's median bf16 GEMM throughput over the burn's sustained load"
    )
    # What the bench and the burn report on nodes probed on CPU (probes.device: cpu), where no datasheet says
    # what to expect: a one-node run is judged only where these are written.
    gemm_fp32_gflops_min: Annotated[float, Field(ge=0)] | None = None
    gemm_bf16_gflops_min: Annotated[float, Field(ge=0)] | None = None
    mem_copy_gbps_min: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="host memory copy bandwidth per process (the CPU bench's memory figure)"
    )
    burn_gflops_min: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="each process's median fp32 GEMM throughput over a CPU burn"
    )
    allreduce_intra_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = None
    allreduce_inter_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = None
    allgather_intra_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = None
    allgather_inter_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = None
    reducescatter_intra_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = None
    reducescatter_inter_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = None
    alltoall_intra_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = None
    alltoall_inter_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = None
    sendrecv_intra_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = None
    sendrecv_inter_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = None
    gpu_pair_copy_gbps_min: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="copy bandwidth from each GPU to each other GPU of the node"
    )
    rail_busbw_gbps_min: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="all-reduce bus bandwidth of one rail across nodes (one rank per node)"
    )
    straggler_pct: Annotated[float, Field(ge=0, le=100)] = 5.0
    noise_k: Annotated[float, Field(ge=1, le=10)] = Field(
        default=3.0,
        description="a figure is below its peers or its history only when the shortfall reaches both "
        "straggler_pct and noise_k times its measured noise (the calibration's, the peers' spread, its repeats); "
        "in between it is inconclusive",
    )
    link_flap_clear_h: Annotated[float, Field(gt=0, le=24 * 365)] = Field(
        default=24.0, description="hours an InfiniBand/RoCE port must stay up after it flapped before it passes again"
    )
    app_xid_max: Annotated[int, Field(ge=0, le=100_000)] = Field(
        default=5,
        description="separate bursts of XIDs usually of the application's making (13, 31, 43, 109) one GPU may "
        "log within app_xid_window_h: they warn up to this many, more fail the node (they follow the GPU)",
    )
    app_xid_window_h: Annotated[float, Field(gt=0, le=24 * 365)] = Field(
        default=24.0,
        description="hours over which application XIDs are counted, and in which a hardware XID makes them fail",
    )
    relative_verdict: Literal["fail", "warn"] = Field(
        default="fail",
        description="what a figure far below the cluster's median or the node's own history is: a failure, or "
        "a warning where relative figures say more about the machine than the node (CPU nodes sharing cores)",
    )
    scaling_efficiency_min: Annotated[float, Field(ge=0, le=1)] | None = None
    training_tokens_per_s_per_gpu_min: Annotated[float, Field(ge=0)] | None = None
    training_mfu_min: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None,
        description="tokens/s per GPU x FLOPs per token over the GPU's dense bf16 peak; left out: the training "
        "probe's default floor (probes.training.defaults)",
    )
    training_dp_efficiency_min: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None,
        description="tokens/s per GPU with every GPU of a node training together over its slowest GPU's solo "
        "tokens/s; left out: the training probe's default (probes.training.defaults)",
    )
    training_scaling_efficiency_min: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None, description="per-GPU tokens/s at n nodes over one node's, at every step of the sweep"
    )


_ENV_KEY = re.compile(r"(?:NCCL|UCX|CUDA_VISIBLE|NVSHMEM|TORCH_NCCL)[A-Za-z0-9_]*")


class HarmfulSetting(_Strict):
    """A site's own rule: an NCCL variable (or one of these values of it) that must not reach a job."""

    key: StrictStr = Field(description="the variable, e.g. NCCL_NET_GDR_LEVEL (NCCL_*, UCX*, CUDA_VISIBLE*, …)")
    values: list[StrictStr] | None = Field(default=None, description="harmful values; left out: any value")
    severity: Literal["fail", "warn"] = "fail"
    why: StrictStr = Field(min_length=1, description="what the setting does to a job, and what to do")

    @field_validator("key")
    @classmethod
    def _key_is_read_from_nodes(cls, key: str) -> str:
        if not _ENV_KEY.fullmatch(key):
            raise ValueError(
                "only variables starting with NCCL, UCX, CUDA_VISIBLE, NVSHMEM or TORCH_NCCL are read from nodes"
            )
        return key


class Profile(_Strict):
    """What a node must be. A key left out is not checked, unless ``base`` names a built-in profile
    (:mod:`inventory.gpus`) whose keys this profile's own override, or ``auto``: the built-in profile of the GPU
    model preflight reads on each node."""

    base: StrictStr | None = Field(
        default=None, description="a built-in profile (h100-sxm, h200-sxm, …) or 'auto'; the keys given here win"
    )
    fabric: StrictStr | None = Field(
        default=None, description="between nodes: auto (the default on a built-in base), a built-in fabric, or none"
    )
    gpu: GpuSpec | None = None
    driver_version: StrictStr | MinVersion | None = None
    cuda_version: StrictStr | None = None
    persistence_mode: Literal["enabled", "disabled"] | None = None
    nvlink: NvlinkSpec | None = None
    nvswitch: NvswitchSpec | None = None
    firmware: FirmwareSpec | None = None
    pcie: PcieSpec | None = None
    infiniband: InfinibandSpec | None = None
    nccl_env: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    nccl_harmful: list[HarmfulSetting] = Field(
        default_factory=list, description="settings this site also refuses, beside the built-in harmful ones"
    )
    probes: ProbeSettings = ProbeSettings()
    training: TrainingSettings = TrainingSettings()
    burn: BurnSettings = BurnSettings()
    thresholds: Thresholds = Thresholds()
    plugins: dict[StrictStr, dict[StrictStr, Any]] = Field(
        default_factory=dict,
        description="settings of the probes added beside the built-in ones, by probe name; each probe's own "
        "model validates them when the inventory loads",
    )

    @model_validator(mode="after")
    def _training_model_builds(self) -> Profile:
        problem = self.training.shape_problem(self.probes.device) if self.training.enabled else None
        if problem:
            raise ValueError(f"training: {problem}")
        return self

    @model_validator(mode="after")
    def _thresholds_can_be_measured(self, info: ValidationInfo) -> Profile:
        """A threshold no probe of this profile measures would reject every node, or be skipped on every one,
        after the whole run: refused now (:mod:`inventory.threshold_needs`), every key at once."""
        problems = threshold_problems(self, info.context)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class DefaultsFile(_Strict):
    profile: StrictStr | None = None
    ssh: SshSettings = SshSettings()
    labels: dict[Name, Name] = Field(default_factory=dict)


class NodeEntryFile(_Strict):
    hosts: StrictStr
    address: StrictStr | None = Field(
        default=None, description="where to connect when the name does not resolve; 'local' = this machine"
    )
    profile: StrictStr | None = None
    ssh: SshSettings = SshSettings()
    labels: dict[Name, Name] = Field(default_factory=dict)

    @field_validator("address")
    @classmethod
    def _address_is_a_host(cls, address: str | None) -> str | None:
        if address is not None and address.strip() and not _ADDRESS.fullmatch(address):
            raise ValueError("not a host name or IP address: use letters, digits, '.', '-', '_' (':' for IPv6)")
        return address


class InventoryFile(_Strict):
    cluster: ClusterName
    defaults: DefaultsFile = DefaultsFile()
    nodes: list[NodeEntryFile]
    exclude: list[StrictStr] = Field(default_factory=list)
    profiles: dict[Name, Profile] = Field(default_factory=dict)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    simulation: SimulationSettings | None = Field(default=None, description="scale work: simulated nodes")


# Resolved ---------------------------------------------------------------------------------------------

LOCAL_ADDRESS = "local"

DEFAULT_SSH = SshSettings(
    host_key_policy="strict",
    connect_timeout_s=10.0,
    command_timeout_s=120.0,
)


@dataclass(frozen=True)
class Node:
    """One node to test, with everything needed to reach and judge it."""

    name: str
    ssh: SshSettings
    profile_name: str
    profile: Profile
    address: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    excluded: bool = False
    slurm_name: str = ""  # the node's name in Slurm, where the inventory's slurm.node_names rule gives another
    simulated: SimulatedAs | None = None  # answered in-process from a recording (scale work)

    @property
    def slurm_node(self) -> str:
        return self.slurm_name or self.name

    @property
    def is_local(self) -> bool:
        return self.address == LOCAL_ADDRESS

    @property
    def reached_over_ssh(self) -> bool:
        """A run reaches this node over SSH (not this machine, not simulated), so it tests SSH on it again."""
        return not self.is_local and self.simulated is None

    @property
    def connect_host(self) -> str:
        """The host to connect to: the address when given, else the name (resolved by DNS or ssh_config)."""
        return self.address if self.address and not self.is_local else self.name


@dataclass(frozen=True)
class Inventory:
    cluster: str
    nodes: list[Node]
    profiles: dict[str, Profile]
    source: str
    digest: str

    @property
    def tested(self) -> list[Node]:
        return [n for n in self.nodes if not n.excluded]

    @property
    def excluded(self) -> list[Node]:
        return [n for n in self.nodes if n.excluded]

    def node(self, name: str) -> Node:
        """By an index built once: stages look nodes up once or more per node (a scan each time is N²)."""
        if len(index := self.__dict__.get("_by_name") or {}) != len(self.nodes):  # new, or the list changed
            index = {n.name: n for n in self.nodes}
            object.__setattr__(self, "_by_name", index)  # a cache beside the frozen fields, not one of them
        return index[name]
