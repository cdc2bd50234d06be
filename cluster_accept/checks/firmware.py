"""Firmware drift: each GPU's VBIOS and InfoROM, each HCA's firmware (sysfs ``fw_ver``, per board type) and the
NIC driver stack (MLNX_OFED / DOCA-OFED as ``ofed_info -s`` names it), against the profile (``firmware:``) and
against the cluster's majority, folded into node sets in the report like the driver version.

A node whose GPU firmware differs from its peers behaves differently under the same job (power and clock
tables, ECC and NVLink handling change with the VBIOS); an HCA firmware off the majority is the usual cause of
one node's links flapping or training slower. Field tools compare exactly these across a cluster (azNHC, imbue,
GCM). A pin is met only when every GPU (every HCA of a board type) meets it: GPUs or HCAs that disagree fail
against a pin, naming those off it with their versions, and an HCA pin on a node that shows no HCA is not met;
without a pin they warn, and those off the cluster's majority fail as drift (a further disagreement never turns a
failure into a pass; a majority of nodes that disagree within themselves is no version to compare with). Drift from
the majority fails, softened to a warning where the node meets a version the profile pins. ``nvidia_peermem``'s
version (GPUDirect RDMA's bridge between the GPU and the NIC driver stacks) is compared with the majority; whether
it must be loaded is the infiniband check's (``infiniband.peermem``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    Expectation,
    Profile,
    Reason,
    Status,
    always,
    dead,
    declare,
    error_row,
    fault,
    healthy,
)
from cluster_accept.checks.sections import NVIDIA_SMI_SKIPPED, marked_sections, read_gpu_query, small_int

NAME = "firmware"
FIELDS = ["index", "pci.bus_id", "vbios_version", "inforom.img"]
COMMAND = (
    f'nvidia-smi --query-gpu={",".join(FIELDS)} --format=csv,noheader 2>&1; echo "### rc=$?"; '
    's="${CLUSTER_ACCEPT_SYSFS:-/sys}"; echo "### hca"; for d in "$s"/class/infiniband/*; do [ -e "$d" ] || '
    'continue; echo "${d##*/}|$(cat "$d/fw_ver" 2>/dev/null)|$(cat "$d/hca_type" 2>/dev/null)|'
    '$(cat "$d/board_id" 2>/dev/null)"; done; echo "### ofed"; ofed_info -s 2>/dev/null || echo none; '
    'echo "### peermem"; m="$s/module/nvidia_peermem"; if [ -r "$m/version" ]; then cat "$m/version"; '
    'elif [ -d "$m" ]; then echo loaded; else echo none; fi; echo "### end"'
)

REASONS = declare(
    NVIDIA_SMI_SKIPPED,
    Reason(
        "version_mismatch",
        Status.FAIL,
        "the firmware differs from the version the profile pins: flash the cluster's version (nvflash, mlxfwmanager)",
        Action.FIX_CONFIG,
    ),
    Reason(
        "differs_between_gpus",
        Status.WARN,
        "the node's GPUs run different VBIOS or InfoROM versions: flash them alike",
        Action.FIX_CONFIG,
    ),
    Reason(
        "differs_between_hcas",
        Status.WARN,
        "HCAs of one board type run different firmware on this node: flash them alike (mlxfwmanager)",
        Action.FIX_CONFIG,
    ),
)


@dataclass(frozen=True)
class Hca:
    name: str  # mlx5_0
    fw_ver: str
    hca_type: str  # MT4129
    board_id: str


@dataclass(frozen=True)
class Firmware:
    vbios: dict[int, str] = field(default_factory=dict)  # GPU index -> VBIOS
    inforom: dict[int, str] = field(default_factory=dict)
    hcas: list[Hca] = field(default_factory=list)
    ofed: str | None = None
    peermem: str | None = None  # nvidia_peermem's version ('loaded' where it has none); None: not loaded
    failure: str = ""
    error: str | None = None
    raw: str = ""


def _sections(stdout: str) -> dict[str, list[str]] | None:
    """nvidia-smi's answer and its exit status (``smi``: [answer, status]), then the marked sections."""
    head, sep, rest = stdout.partition("### rc=")
    if not sep:
        return None
    rc_text, _, rest = rest.partition("\n")
    parts = marked_sections(rest, frozenset({"hca", "ofed"}))
    return None if parts is None else {"smi": [head, rc_text.strip()], **parts}


def parse(stdout: str, exit_code: int | None = 0) -> Firmware:
    parts = _sections(stdout)
    if parts is None:
        return Firmware(error="output truncated or without its sections", raw=stdout)
    smi, rc = parts["smi"]
    rows, failure, problem = read_gpu_query(smi, small_int(rc.lstrip("-")), FIELDS)
    if failure or problem:
        return Firmware(failure=failure, error=problem or None, raw=stdout)
    if any(small_int(r["index"]) is None for r in rows):
        return Firmware(error="a GPU index that is no small number", raw=stdout)
    hcas = [Hca(*(line.split("|") + ["", "", ""])[:4]) for line in parts["hca"] if line.count("|") == 3]
    ofed = " ".join(line.strip() for line in parts["ofed"] if line.strip()) or None
    peermem = " ".join(line.strip() for line in parts.get("peermem", []) if line.strip()) or None
    return Firmware(
        vbios={int(r["index"]): r["vbios_version"] for r in rows},  # small numbers, checked above
        inforom={int(r["index"]): r["inforom.img"] for r in rows},
        hcas=[Hca(h.name, h.fw_ver.strip(), h.hca_type.strip(), h.board_id.strip()) for h in hcas],
        ofed=None if ofed in (None, "none") else ofed,
        peermem=None if peermem in (None, "none") else peermem,
        raw=stdout,
    )


MIXED = "mixed"  # what a node whose GPUs (or HCAs of one type) disagree compares as across the cluster
_ALIKE = {"differs_between_gpus": "one version on every GPU", "differs_between_hcas": "one version"}


def _one(values: dict[int, str]) -> str | None:
    found = set(values.values())
    return found.pop() if len(found) == 1 else None


def _hca_types(model: Firmware) -> dict[str, list[Hca]]:
    types: dict[str, list[Hca]] = {}
    for hca in model.hcas:
        types.setdefault(hca.hca_type or hca.board_id or "hca", []).append(hca)
    return types


def cluster_values(model: Firmware) -> dict[str, str]:
    """The versions compared across nodes: one per kind (a node whose GPUs disagree compares as 'mixed')."""
    if model.error or model.failure:
        return {}
    values = {"vbios": _one(model.vbios) or MIXED, "inforom": _one(model.inforom) or MIXED}
    for kind, hcas in _hca_types(model).items():
        versions = sorted({h.fw_ver for h in hcas})
        values[f"hca_fw:{kind}"] = versions[0] if len(versions) == 1 else MIXED
    if model.ofed:
        values["ofed"] = model.ofed
    if model.peermem:
        values["peermem"] = model.peermem
    return values


def _majority(key: str, cluster: ClusterView) -> str | None:
    """The cluster's version of ``key``; none where most nodes disagree within themselves ('mixed' is no version
    to flash a node to, and a node that agrees with itself is no drift from it)."""
    majority = cluster.majority_of(key)
    return None if majority == MIXED else majority


def _judged(key: str, item: str, seen: str, pinned: str | None, cluster: ClusterView) -> list[CheckRow]:
    """One version against the profile's pin and the cluster's majority (drift softened where the pin is met)."""
    rows: list[CheckRow] = []
    met = False
    if pinned is not None:
        met = seen == pinned
        rows.append(CheckRow(NAME, item, Status.PASS if met else Status.FAIL, "ok" if met else "version_mismatch",
                             seen, pinned))  # fmt: skip
    majority = _majority(key, cluster)
    if majority is not None and majority != seen:
        rows.append(CheckRow(NAME, f"{item}_drift", Status.WARN if met else Status.FAIL, "drift", seen,
                             f"{majority} (majority)"))  # fmt: skip
    elif pinned is None:
        reason, expected = ("ok", f"{majority} (majority)") if majority is not None else ("recorded", None)
        rows.append(CheckRow(NAME, item, Status.PASS, reason, seen, expected))
    return rows


def _parts_rows(key: str, parts: dict[str, str], pinned: str | None, cluster: ClusterView, why: str) -> list[CheckRow]:
    """The versions of one kind on a node's parts (its GPUs, or its HCAs of one board type), by part name. One
    version is judged as the node's. Parts that disagree fail ``version_mismatch`` against a pin, naming the parts
    off it with their versions (a pin is met only when every part meets it); without a pin they warn (``why``),
    and those off the cluster's majority fail ``drift``, named likewise."""
    versions = set(parts.values())
    if len(versions) == 1:
        return _judged(key, key, versions.pop(), pinned, cluster)
    seen = ", ".join(f"{name} {version}" for name, version in parts.items())
    mixed = f"several versions on the node: {seen}"
    if pinned is not None:
        off = ", ".join(f"{name} {version}" for name, version in parts.items() if version != pinned)
        return [CheckRow(NAME, key, Status.FAIL, "version_mismatch", off, pinned, mixed)]
    rows = [CheckRow(NAME, key, Status.WARN, why, seen, _ALIKE[why])]
    majority = _majority(key, cluster)
    if majority is not None:
        off = ", ".join(f"{name} {version}" for name, version in parts.items() if version != majority)
        rows.append(CheckRow(NAME, f"{key}_drift", Status.FAIL, "drift", off, f"{majority} (majority)", mixed))
    return rows


def _gpu_rows(values: dict[int, str], key: str, pinned: str | None, cluster: ClusterView) -> list[CheckRow]:
    parts = {f"gpu{index}": version for index, version in sorted(values.items())}
    return _parts_rows(key, parts, pinned, cluster, "differs_between_gpus")


def _hca_rows(model: Firmware, pinned: str | None, cluster: ClusterView) -> list[CheckRow]:
    """Each board type's firmware; a pin with no HCA to meet it is not met (it names no HCA found, not a pass)."""
    types = _hca_types(model)
    if not types and pinned is not None:
        return [CheckRow(NAME, "hca_fw", Status.FAIL, "version_mismatch", "no HCA", pinned,
                         "the profile pins firmware.hca_fw; /sys/class/infiniband lists no device")]  # fmt: skip
    rows: list[CheckRow] = []
    for kind, hcas in sorted(types.items()):
        parts = {hca.name: hca.fw_ver for hca in hcas}
        rows += _parts_rows(f"hca_fw:{kind}", parts, pinned, cluster, "differs_between_hcas")
    return rows


def evaluate(model: Firmware, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        return [CheckRow(NAME, "nvidia-smi", Status.SKIP, "nvidia_smi_failed", model.failure, None)]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    pins = profile.firmware
    rows = _gpu_rows(model.vbios, "vbios", pins.vbios if pins else None, cluster)
    rows += _gpu_rows(model.inforom, "inforom", pins.inforom if pins else None, cluster)
    rows += _hca_rows(model, pins.hca_fw if pins else None, cluster)
    if model.ofed is not None or (pins and pins.ofed):
        rows += _judged("ofed", "ofed", model.ofed or "none", pins.ofed if pins else None, cluster)
    if model.peermem is not None:
        rows += _judged("peermem", "peermem", model.peermem, None, cluster)
    return rows


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    expectations=(Expectation("firmware", "preflight", NAME, always),),
    samples=(
        healthy("healthy", {"recorded"}, fixture="firmware/healthy.txt"),
        fault("vbios_mismatch", {"differs_between_gpus"}, fixture="firmware/vbios_mismatch.txt"),
        dead("driver_dead", {"nvidia_smi_failed"}, fixture="firmware/driver_dead.txt"),
    ),
)
