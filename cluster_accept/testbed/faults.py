"""Fault plans: which simulated node is broken how, written in YAML or built in Python.

A plan maps node names to faults. A fault is written as a bare kind (``down``) or as a one-key mapping
from kind to parameters (``{nvlink_inactive: {gpu: 1, link: 7}}``); ``nccl_env`` takes the variables
themselves (``{nccl_env: {NCCL_IB_HCA: mlx5_0, NCCL_SOCKET_IFNAME: null}}``). Every kind is a small
pydantic model that forbids unknown keys, so a typo in a plan is an error naming file, node and key
instead of a fault silently not planted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, cast, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator

from cluster_accept.testbed.burn_faults import Cotenant, DcgmFail, HotGpu, NoDcgm, SdcFlip, Throttle
from cluster_accept.testbed.fault_base import _Fault
from cluster_accept.testbed.hgx_faults import NvswitchBoard, PcieAer, Sxid
from cluster_accept.testbed.net_faults import EfaSoftware, HcaFirmware, IbPort, RoceQos

GpuIndex = Annotated[StrictInt, Field(ge=0, le=63)]
LinkIndex = Annotated[StrictInt, Field(ge=0, le=63)]
Count = Annotated[StrictInt, Field(ge=0)]


class Down(_Fault):
    """sshd is not started: connections are refused."""

    kind: Literal["down"] = "down"


class Off(_Fault):
    """The node's link is down inside its namespace: connections time out."""

    kind: Literal["off"] = "off"


class HostKeyChanged(_Fault):
    """sshd serves a host key that is not the one in known_hosts."""

    kind: Literal["host_key_changed"] = "host_key_changed"


class AuthRefused(_Fault):
    """The test-bed's client key is not authorized on the node."""

    kind: Literal["auth_refused"] = "auth_refused"


class Slow(_Fault):
    """A token-bucket limit on the node's link, both directions."""

    kind: Literal["slow"] = "slow"
    rate_mbit: Annotated[float, Field(gt=0)]


class Slower(_Fault):
    """Every ``torch.matmul`` on the node takes ``factor`` times as long, in every process of the node (a
    ``sitecustomize`` on its ``PYTHONPATH``): its GEMM figures are that much lower and nothing else changes, a
    node slower than its peers by a known amount. Above 1 (1 would be no fault), at most 100."""

    kind: Literal["slower"] = "slower"
    factor: Annotated[float, Field(gt=1, le=100, strict=True)] = 1.15


class NvidiaSmiFail(_Fault):
    """Every nvidia-smi call prints the "couldn't communicate with the NVIDIA driver" message, exit 9."""

    kind: Literal["nvidia_smi_fail"] = "nvidia_smi_fail"


class NvidiaSmiHang(_Fault):
    """Every nvidia-smi call hangs (until its caller goes away)."""

    kind: Literal["nvidia_smi_hang"] = "nvidia_smi_hang"


class Garbage(_Fault):
    """nvidia-smi prints random junk and exits 0."""

    kind: Literal["garbage"] = "garbage"


class Truncated(_Fault):
    """nvidia-smi outputs are cut in the middle."""

    kind: Literal["truncated"] = "truncated"


class DriverVersion(_Fault):
    """Another driver version, in every nvidia-smi output and in /proc/driver/nvidia/version."""

    kind: Literal["driver_version"] = "driver_version"
    version: StrictStr


class GpuMissing(_Fault):
    """The last GPU vanishes from every output."""

    kind: Literal["gpu_missing"] = "gpu_missing"


class PersistenceDisabled(_Fault):
    """Persistence mode off on one GPU (all GPUs when ``gpu`` is left out)."""

    kind: Literal["persistence_disabled"] = "persistence_disabled"
    gpu: GpuIndex | None = None


class NvlinkInactive(_Fault):
    """``Link N: <inactive>`` in ``nvlink -s``/``--status``; one NVLink fewer to every peer in ``topo -m``."""

    kind: Literal["nvlink_inactive"] = "nvlink_inactive"
    gpu: GpuIndex
    link: LinkIndex


class NvlinkErrors(_Fault):
    """Non-zero counters for one link in ``nvlink -e``."""

    kind: Literal["nvlink_errors"] = "nvlink_errors"
    gpu: GpuIndex
    link: LinkIndex
    crc: Count = 1
    replay: Count = 0
    recovery: Count = 0


class PcieWidth(_Fault):
    """Current PCIe link width of one GPU (query-gpu, -q, -q -x)."""

    kind: Literal["pcie_width"] = "pcie_width"
    gpu: GpuIndex
    width: Literal[1, 2, 4, 8, 16, 32]


class NcclEnv(_Fault):
    """Changes to the node's NCCL environment (sessions and /etc/nccl.conf); a null value removes the key."""

    kind: Literal["nccl_env"] = "nccl_env"
    env: dict[StrictStr, StrictStr | None]

    @field_validator("env")
    @classmethod
    def _one_line(cls, env: dict[str, str | None]) -> dict[str, str | None]:
        for key, value in env.items():
            if not key.replace("_", "").isalnum() or key[0].isdigit():
                raise ValueError(f"{key!r} is not an environment variable name")
            if value is not None and ("\n" in value or "\r" in value):
                raise ValueError(f"value of {key} spans several lines")
        return env

    def as_yaml(self) -> Any:
        return {self.kind: dict(self.env)}


class Xid(_Fault):
    """An NVRM Xid line for one GPU in the node's kernel log (``dmesg``), stamped ``at_s`` seconds after boot
    (default: when it is planted, as a fault that happens now)."""

    kind: Literal["xid"] = "xid"
    code: Annotated[StrictInt, Field(ge=0)]
    gpu: GpuIndex = 0
    message: StrictStr | None = None
    at_s: Annotated[float, Field(ge=0)] | None = None


class Replace(_Fault):
    """Generic text replacement in one of the node's served files (e.g. ``nvidia-smi-q.txt``)."""

    kind: Literal["replace"] = "replace"
    file: StrictStr
    old: Annotated[StrictStr, Field(min_length=1)]
    new: StrictStr


class GpuField(_Fault):
    """One ``--query-gpu`` field of one GPU (or all) answers ``value``: clock event reasons, ECC counters..."""

    kind: Literal["gpu_field"] = "gpu_field"
    field: StrictStr
    value: StrictStr
    gpu: GpuIndex | None = None


class OldDriver(_Fault):
    """A driver branch older than some ``--query-gpu`` field names (535 and before): nvidia-smi refuses each of
    ``refuse`` as asked, the whole query failing as a real driver's does, yet answers older aliases."""

    kind: Literal["old_driver"] = "old_driver"
    refuse: list[StrictStr] = Field(
        default_factory=lambda: [
            "clocks_event_reasons.active",
            "clocks_event_reasons.supported",
            "remapped_rows.pending",
            "remapped_rows.failure",
            "remapped_rows.correctable",
            "remapped_rows.uncorrectable",
        ]
    )


class SlowRail(_Fault):
    """A tbf limit both ways on the node's ``rail<k>`` link (a slow NIC or cable); needs ``up(rails=…)``."""

    kind: Literal["slow_rail"] = "slow_rail"
    rail: Annotated[int, Field(ge=0, le=15)]
    rate_mbit: Annotated[float, Field(gt=0)]


class IbCounter(_Fault):
    """An error counter of HCA ``mlx5_<rail>`` port 1 set to ``value`` (raised between runs: it grew)."""

    kind: Literal["ib_counter"] = "ib_counter"
    rail: Annotated[int, Field(ge=0, le=15)] = 0
    counter: Literal["symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors"] = "symbol_error"
    value: Annotated[int, Field(ge=0)]


Fault = (
    Down
    | Off
    | HostKeyChanged
    | AuthRefused
    | Slow
    | Slower
    | NvidiaSmiFail
    | NvidiaSmiHang
    | Garbage
    | Truncated
    | DriverVersion
    | GpuMissing
    | PersistenceDisabled
    | NvlinkInactive
    | NvlinkErrors
    | PcieWidth
    | NcclEnv
    | Xid
    | Replace
    | GpuField
    | OldDriver
    | SlowRail
    | IbCounter
    | IbPort
    | EfaSoftware
    | RoceQos
    | Throttle
    | SdcFlip
    | Cotenant
    | DcgmFail
    | NoDcgm
    | HotGpu
    | HcaFirmware
    | NvswitchBoard
    | Sxid
    | PcieAer
)

# How a fault may be written: a model, a bare kind, or a one-key mapping kind -> parameters.
FaultSpec = Fault | str | dict[str, Any]

KINDS: dict[str, type[_Fault]] = {cls.model_fields["kind"].default: cls for cls in get_args(Fault)}


class FaultPlanError(ValueError):
    """A plan that cannot be used; the message has one ``SOURCE: where: what`` line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def parse_fault(item: Any, where: str) -> Fault:
    """One plan entry (bare kind, ``{kind: params}`` or a fault model) -> fault model."""
    if isinstance(item, _Fault):
        return cast(Fault, item)
    if item is False:  # YAML 1.1 reads a bare `off` as false
        item = "off"
    if isinstance(item, str):
        kind, params = item, None
    elif isinstance(item, dict) and len(item) == 1:
        kind, params = next(iter(item.items()))
    else:
        raise FaultPlanError([f"{where}: expected a fault kind or a one-key mapping kind: params, got {item!r}"])
    if not isinstance(kind, str) or kind not in KINDS:
        known = ", ".join(sorted(KINDS))
        raise FaultPlanError([f"{where}: unknown fault kind {kind!r} (known: {known})"])
    cls = KINDS[kind]
    if kind == "nccl_env" and not (isinstance(params, dict) and set(params) == {"env"}):
        params = {"env": params if params is not None else {}}
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise FaultPlanError([f"{where}.{kind}: expected a mapping of parameters, got {params!r}"])
    try:
        return cast(Fault, cls.model_validate({**params, "kind": kind}))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"] if p != "env" or kind != "nccl_env")
            key = f"{where}.{kind}" + (f".{loc}" if loc else "")
            if err["type"] == "extra_forbidden":
                problems.append(f"{key}: unknown parameter (known: {', '.join(_params(cls)) or 'none'})")
            elif err["type"] == "missing":
                problems.append(f"{key}: required parameter is missing")
            else:
                hint = " (quote it)" if err["type"] == "string_type" and err.get("input") is not None else ""
                problems.append(f"{key}: {err['msg']}{hint} (got {err.get('input')!r})")
        raise FaultPlanError(problems) from exc


def _params(cls: type[_Fault]) -> list[str]:
    return [name for name in cls.model_fields if name != "kind"]


def _parse_nodes(data: Any, source: str) -> dict[str, list[Fault]]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FaultPlanError([f"{source}nodes: expected a mapping node name -> list of faults"])
    problems: list[str] = []
    nodes: dict[str, list[Fault]] = {}
    for node, items in data.items():
        where = f"{source}nodes.{node}"
        if not isinstance(node, str):
            problems.append(f"{where}: node names must be strings")
            continue
        if isinstance(items, (str, dict, _Fault)):
            items = [items]
        if not isinstance(items, list):
            problems.append(f"{where}: expected a list of faults, got {items!r}")
            continue
        faults: list[Fault] = []
        for i, item in enumerate(items):
            try:
                faults.append(parse_fault(item, f"{where}[{i}]"))
            except FaultPlanError as exc:
                problems.extend(exc.problems)
        nodes[node] = faults
    if problems:
        raise FaultPlanError(problems)
    return nodes


class FaultPlan(BaseModel):
    """Node name -> faults. ``FaultPlan(nodes={"node03": ["down"], "node05": [Slow(rate_mbit=10)]})``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    nodes: dict[str, list[Fault]] = Field(default_factory=dict)

    def __init__(self, nodes: Mapping[str, Sequence[FaultSpec] | FaultSpec] | None = None) -> None:
        """Faults may be given as models, bare kinds (``"down"``) or ``{kind: params}`` mappings."""
        super().__init__(nodes=nodes if nodes is not None else {})

    @field_validator("nodes", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        return _parse_nodes(value, "")

    def faults(self, node: str) -> list[_Fault]:
        return list(self.nodes.get(node, []))

    def has(self, node: str, kind: str) -> bool:
        return any(f.kind == kind for f in self.nodes.get(node, []))

    def first(self, node: str, kind: str) -> _Fault | None:
        return next((f for f in self.nodes.get(node, []) if f.kind == kind), None)

    def as_yaml(self) -> dict[str, Any]:
        return {"nodes": {node: [f.as_yaml() for f in faults] for node, faults in self.nodes.items()}}


def fault_plan_from_data(data: Any, source: str = "(fault plan)") -> FaultPlan:
    """A plan from parsed YAML/JSON data; errors are :class:`FaultPlanError` lines naming ``source``."""
    if data is None:
        return FaultPlan()
    if not isinstance(data, dict):
        raise FaultPlanError([f"{source}: (top level): expected a mapping with the key 'nodes'"])
    unknown = sorted(str(k) for k in data if k != "nodes")
    if unknown:
        raise FaultPlanError([f"{source}: {key}: unknown key (a plan has only 'nodes')" for key in unknown])
    return FaultPlan(nodes=_parse_nodes(data.get("nodes"), f"{source}: "))


class _PlanLoader(yaml.SafeLoader):
    """Safe YAML where only true/false are booleans: ``[off]`` is the fault ``off``, not ``[False]``."""


_PlanLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_PlanLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_fault_plan(path: str | Path) -> FaultPlan:
    """Read a YAML fault plan; raises :class:`FaultPlanError` naming the file, node and key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FaultPlanError([f"{path}: cannot read the file: {exc.strerror or exc}"]) from exc
    try:
        data = yaml.load(text, Loader=_PlanLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise FaultPlanError([f"{path}: not valid YAML: {exc}"]) from exc
    return fault_plan_from_data(data, str(path))
