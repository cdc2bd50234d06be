"""A simulated node's data: the base capture set with the node's faults applied, written to its data dir.

Faults are applied once, at ``up``, by editing the node's copies of the captured outputs and of the
``--query-gpu`` field table; the node-side stand-ins then only read files. That keeps faults data-driven
(one small function per kind, easy to test without any network) and keeps the stand-ins dumb.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster_accept.testbed import textops
from cluster_accept.testbed.captures import FieldTable, build_table, load_base
from cluster_accept.testbed.faults import (
    Cotenant,
    DriverVersion,
    GpuField,
    HotGpu,
    NcclEnv,
    NvlinkErrors,
    NvlinkInactive,
    OldDriver,
    PcieWidth,
    PersistenceDisabled,
    Replace,
    Throttle,
    Xid,
    _Fault,
)

# Behaviours of nvidia-smi itself, checked by the stand-in in this order.
MODE_KINDS = ("nvidia_smi_hang", "nvidia_smi_fail", "garbage", "truncated")

XID_MESSAGES = {
    13: "Graphics Exception: ESR 0x504648=0x80000000 0x504650=0x0 0x504644=0xd3eff2 0x50464c=0x7f",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_1c000000.",
    43: "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x1c024",
    45: "Ch 00000010, errorString Preemptive Cleanup, Info 0x0",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 1.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark row for remapping.",
    74: "NVLink: fatal error detected on link 7(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
}


class FaultApplyError(ValueError):
    """A fault that does not fit the node (GPU or link that does not exist, text not found)."""


@dataclass
class NodeData:
    """Everything a node serves: outputs by file name, field table, nvidia-smi modes, env, kernel log."""

    files: dict[str, str]
    table: FieldTable
    modes: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    nccl_conf: dict[str, str] = field(default_factory=dict)
    dmesg: str = ""
    refused_fields: list[str] = field(default_factory=list)  # --query-gpu names the simulated driver refuses
    under_load: dict[str, dict[str, str]] = field(default_factory=dict)  # GPU -> --query-gpu answers while loaded


def _q_files(files: dict[str, str]) -> list[str]:
    return [n for n in files if n == "nvidia-smi-q.txt" or (n.startswith("q-") and n.endswith(".txt"))]


def _nvlink_files(files: dict[str, str]) -> list[str]:
    return [n for n in files if n.startswith("nvlink-")]


def _gpu(data: NodeData, gpu: int, fault: _Fault) -> int:
    if not 0 <= gpu < data.table.gpu_count:
        raise FaultApplyError(f"{fault.kind}: GPU {gpu} does not exist (the node has {data.table.gpu_count})")
    return gpu


def _bus(data: NodeData, gpu: int) -> str:
    return data.table.get("pci.bus_id", gpu)


def edit_gpu(data: NodeData, gpu: int, q_edit: Callable[[str], str], x_edit: Callable[[str], str]) -> None:
    """Apply ``q_edit`` to GPU ``gpu``'s block of every ``-q`` text and ``x_edit`` to its ``-q -x`` block."""
    bus = _bus(data, gpu)
    for name in _q_files(data.files):
        data.files[name] = textops.q_blocks(data.files[name]).edit(bus, q_edit).join()
    if "nvidia-smi-q-x.txt" in data.files:
        data.files["nvidia-smi-q-x.txt"] = textops.xml_blocks(data.files["nvidia-smi-q-x.txt"]).edit(bus, x_edit).join()


def _sub_required(pattern: str, repl: str, text: str, what: str) -> str:
    new, count = re.subn(pattern, repl, text, flags=re.MULTILINE)
    if count == 0:
        raise FaultApplyError(f"{what}: not found in the captured output")
    return new


def apply_driver_version(data: NodeData, fault: DriverVersion) -> None:
    old = data.table.get("driver_version", 0)
    for name, text in data.files.items():
        if name == "nvidia-smi.txt":
            text = "".join(textops.replace_keep_width(line, old, fault.version) for line in text.splitlines(True))
        data.files[name] = text.replace(old, fault.version)
    data.table.set("driver_version", None, fault.version)


def apply_persistence(data: NodeData, fault: PersistenceDisabled) -> None:
    gpus = range(data.table.gpu_count) if fault.gpu is None else [_gpu(data, fault.gpu, fault)]
    for g in gpus:
        data.table.set("persistence_mode", g, "Disabled")
        edit_gpu(
            data,
            g,
            lambda t: re.sub(r"^(\s+Persistence Mode\s+: )Enabled$", r"\1Disabled", t, flags=re.MULTILINE),
            lambda t: t.replace("<persistence_mode>Enabled<", "<persistence_mode>Disabled<"),
        )
        if "nvidia-smi.txt" in data.files:
            blocks = textops.table_blocks(data.files["nvidia-smi.txt"])
            data.files["nvidia-smi.txt"] = blocks.edit(str(g), lambda t: t.replace(" On  |", " Off |", 1)).join()


def apply_pcie_width(data: NodeData, fault: PcieWidth) -> None:
    g = _gpu(data, fault.gpu, fault)
    data.table.set("pcie.link.width.current", g, str(fault.width))
    edit_gpu(
        data,
        g,
        lambda t: re.sub(r"(Link Width\n\s+Max\s+: \S+\n\s+Current\s+: )\d+x", rf"\g<1>{fault.width}x", t),
        lambda t: re.sub(r"<current_link_width>\d+x<", f"<current_link_width>{fault.width}x<", t),
    )


def _edit_nvlink(data: NodeData, names: Sequence[str], gpu: int, change: Callable[[str], str]) -> None:
    for name in names:
        blocks = textops.nvlink_blocks(data.files.get(name, ""))
        if str(gpu) not in dict(blocks.blocks):
            raise FaultApplyError(f"GPU {gpu} has no NVLinks in {name}")
        data.files[name] = blocks.edit(str(gpu), change).join()


def apply_nvlink_inactive(data: NodeData, fault: NvlinkInactive) -> None:
    g = _gpu(data, fault.gpu, fault)
    pattern = rf"^(\s+Link {fault.link}: ).*GB/s$"
    what = f"nvlink_inactive: GPU {g} link {fault.link}"
    _edit_nvlink(data, ["nvlink-s.txt"], g, lambda t: _sub_required(pattern, r"\1<inactive>", t, what))
    _edit_nvlink(data, ["nvlink-status.txt"], g, lambda t: re.sub(pattern, r"\1<inactive>", t, flags=re.M))
    if "topo-m.txt" in data.files:
        data.files["topo-m.txt"] = textops.topo_links(data.files["topo-m.txt"], g, -1)


def apply_nvlink_errors(data: NodeData, fault: NvlinkErrors) -> None:
    g = _gpu(data, fault.gpu, fault)
    what = f"nvlink_errors: GPU {g} link {fault.link}"

    def change(text: str) -> str:
        for label, value in (("Replay", fault.replay), ("Recovery", fault.recovery), ("CRC", fault.crc)):
            text = _sub_required(rf"^(\s+Link {fault.link}: {label} Errors: )\d+$", rf"\g<1>{value}", text, what)
        return text

    _edit_nvlink(data, ["nvlink-e.txt"], g, change)


def apply_gpu_missing(data: NodeData) -> None:
    g = data.table.gpu_count - 1
    if g < 0:
        return
    bus, uuid = _bus(data, g), data.table.get("uuid", g)
    files = data.files
    for name in _q_files(files):
        text = textops.q_blocks(files[name]).keep(lambda k: k != bus).join()
        files[name] = re.sub(r"^(Attached GPUs\s+: )\d+", rf"\g<1>{g}", text, flags=re.MULTILINE)
    if "nvidia-smi-q-x.txt" in files:
        text = textops.xml_blocks(files["nvidia-smi-q-x.txt"]).keep(lambda k: k != bus).join()
        files["nvidia-smi-q-x.txt"] = re.sub(r"<attached_gpus>\d+<", f"<attached_gpus>{g}<", text)
    for name in _nvlink_files(files):
        files[name] = textops.nvlink_blocks(files[name]).keep(lambda k: k != str(g)).join()
    if "nvidia-smi.txt" in files:
        files["nvidia-smi.txt"] = textops.table_blocks(files["nvidia-smi.txt"]).keep(lambda k: k != str(g)).join()
    if "nvidia-smi-L.txt" in files:
        files["nvidia-smi-L.txt"] = "".join(
            line for line in files["nvidia-smi-L.txt"].splitlines(True) if not line.startswith(f"GPU {g}: ")
        )
    if "topo-m.txt" in files:
        files["topo-m.txt"] = textops.drop_topo_gpu(files["topo-m.txt"], g)
    for name in ("query-remapped-rows.txt", "query-retired-pages.txt", "query-compute-apps.txt"):
        if name in files:
            lines = files[name].splitlines(True)
            files[name] = "".join(lines[:1] + [x for x in lines[1:] if bus not in x and uuid not in x])
    data.table.drop_gpu(g)
    data.table.set("count", None, str(g))


def apply_replace(data: NodeData, fault: Replace) -> None:
    if fault.file not in data.files:
        raise FaultApplyError(f"replace: no file {fault.file!r}; files: {', '.join(sorted(data.files))}")
    if fault.old not in data.files[fault.file]:
        raise FaultApplyError(f"replace: {fault.old!r} not found in {fault.file}")
    data.files[fault.file] = data.files[fault.file].replace(fault.old, fault.new)


def parse_env(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            env[key.strip()] = value
    return env


def base_dmesg(data: NodeData) -> str:
    uname = data.files.get("uname.txt", "Linux vm 6.8.0 #1 SMP x86_64 GNU/Linux").split()
    release = uname[2] if len(uname) > 2 else "6.8.0"
    nvrm = data.files.get("proc-driver-version.txt", "").splitlines()[0:1]
    module = nvrm[0].split("NVRM version: ", 1)[-1].rstrip() if nvrm else "NVIDIA UNIX Kernel Module"
    driver = data.table.get("driver_version", 0) if data.table.gpu_count else "unknown"
    lines = [
        f"[    0.000000] Linux version {release} (nixbld@localhost) #1 SMP PREEMPT_DYNAMIC",
        f"[    0.000000] Command line: BOOT_IMAGE=/boot/vmlinuz-{release} root=/dev/vda1 ro console=ttyS0",
        "[    3.912877] nvidia: loading out-of-tree module taints kernel.",
        "[    4.021345] nvidia-nvlink: Nvlink Core is being initialized, major device number 236",
        f"[    4.388101] NVRM: loading {module}",
        f"[    4.512233] nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  {driver}",
        "[    4.733019] nvidia_uvm: module uses symbols from proprietary module nvidia, inheriting taint.",
        "[    5.104452] EXT4-fs (vda1): mounted filesystem with ordered data mode. Quota mode: none.",
    ]
    return "\n".join(lines) + "\n"


def uptime_s() -> float:
    """This machine's seconds since boot: the stamp of a kernel log line written now."""
    return float(Path("/proc/uptime").read_text().split()[0])


def xid_line(data: NodeData, fault: Xid, seq: int) -> str:
    g = _gpu(data, fault.gpu, fault)
    domain, bus, rest = _bus(data, g).split(":")
    pci = f"{domain[-4:]}:{bus}:{rest.split('.')[0]}".lower()
    message = fault.message or XID_MESSAGES.get(fault.code, "Unknown error")
    stamp = fault.at_s if fault.at_s is not None else uptime_s() + 0.25 * seq
    return f"[{stamp:12.6f}] NVRM: Xid (PCI:{pci}): {fault.code}, pid=0, name=swapper/0, {message}\n"


def build_node(
    base: str, faults: Sequence[_Fault], nccl_env: dict[str, str] | None = None, node: str = "node"
) -> NodeData:
    """The node's data: ``base`` captures + the profile's NCCL settings + ``faults`` applied."""
    files = load_base(base).files
    replaced = NodeData(files=files, table=FieldTable([], {}, {}))
    for fault in faults:
        if isinstance(fault, Replace):
            apply_replace(replaced, fault)
    data = NodeData(files=replaced.files, table=build_table(replaced.files))
    data.nccl_conf = dict(nccl_env or {})
    data.env = {**parse_env(files.get("env-nccl.txt", "")), **data.nccl_conf}
    try:
        for fault in faults:
            if isinstance(fault, DriverVersion):
                apply_driver_version(data, fault)
            elif isinstance(fault, PersistenceDisabled):
                apply_persistence(data, fault)
            elif isinstance(fault, PcieWidth):
                apply_pcie_width(data, fault)
            elif isinstance(fault, NvlinkInactive):
                apply_nvlink_inactive(data, fault)
            elif isinstance(fault, NvlinkErrors):
                apply_nvlink_errors(data, fault)
            elif isinstance(fault, GpuField):
                if data.table.canonical(fault.field) is None:
                    raise FaultApplyError(f"gpu_field: {fault.field!r} is not a --query-gpu field of this base")
                data.table.set(fault.field, fault.gpu, fault.value)
            elif isinstance(fault, NcclEnv):
                for key, value in fault.env.items():
                    for env in (data.env, data.nccl_conf):
                        if value is None:
                            env.pop(key, None)
                        else:
                            env[key] = value
        data.dmesg = base_dmesg(data)
        xids = [f for f in faults if isinstance(f, Xid)]
        data.dmesg += "".join(xid_line(data, f, i) for i, f in enumerate(xids))
        if any(f.kind == "gpu_missing" for f in faults):
            apply_gpu_missing(data)
    except FaultApplyError as exc:
        raise FaultApplyError(f"{node}: {exc}") from exc
    data.modes = [k for k in MODE_KINDS if any(f.kind == k for f in faults)]
    data.refused_fields = sorted({name for f in faults if isinstance(f, OldDriver) for name in f.refuse})
    data.under_load = loaded_answers(data, [f for f in faults if isinstance(f, (Throttle, HotGpu))])
    cotenants = [f for f in faults if isinstance(f, Cotenant)]
    if cotenants:
        data.files["query-compute-apps-loaded.txt"] = loaded_apps(data, cotenants)
    return data


def loaded_apps(data: NodeData, cotenants: Sequence[Cotenant]) -> str:
    """The compute processes nvidia-smi lists while the burn runs: each co-tenant on its GPU."""
    uuids = data.table.values.get("uuid", [])
    lines = ["gpu_uuid, pid, process_name, used_gpu_memory [MiB]"]
    for fault in cotenants:
        if fault.gpu >= len(uuids):
            raise FaultApplyError(f"cotenant: no GPU {fault.gpu} (the node has {len(uuids)})")
        lines.append(f"{uuids[fault.gpu]}, {fault.pid}, {fault.name}, {fault.used_memory_mib} MiB")
    return "\n".join(lines) + "\n"


def loaded_answers(data: NodeData, faults: Sequence[Throttle | HotGpu]) -> dict[str, dict[str, str]]:
    """What nvidia-smi answers while the GPUs are loaded: every GPU at its maximum SM clock with no reason
    active (the captures are of idle GPUs), a throttled GPU at its fault's clock with its fault's reasons, a hot
    GPU at its fault's temperature."""
    maxima = data.table.values.get("clocks.max.sm", [])
    loaded = {
        str(gpu): {"clocks.current.sm": clock, "clocks_event_reasons.active": "0x0000000000000000"}
        for gpu, clock in enumerate(maxima)
    }
    for fault in faults:
        if isinstance(fault, HotGpu):
            loaded.setdefault(str(fault.gpu), {})["temperature.gpu"] = str(fault.temp_c)
            continue
        loaded.setdefault(str(fault.gpu), {}).update(
            {
                "clocks.current.sm": f"{fault.sm_clock_mhz} MHz",
                "clocks_event_reasons.active": f"0x{int(fault.reasons, 16):016x}",
            }
        )
    return loaded


def write_node_data(data: NodeData, data_dir: Path, seed: str = "") -> None:
    """Write the node's served files; the stand-ins read ``fields.json`` and ``behavior.json``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for name, text in data.files.items():
        (data_dir / name).write_text(text, encoding="utf-8")
    (data_dir / "fields.json").write_text(json.dumps(data.table.to_json()), encoding="utf-8")
    behavior = {
        "modes": data.modes,
        "seed": seed or data_dir.as_posix(),
        "refused_fields": data.refused_fields,
        "under_load": data.under_load,
    }
    (data_dir / "behavior.json").write_text(json.dumps(behavior), encoding="utf-8")
    (data_dir / "dmesg.txt").write_text(data.dmesg, encoding="utf-8")
    (data_dir / "nccl.conf").write_text("".join(f"{k}={v}\n" for k, v in data.nccl_conf.items()), encoding="utf-8")
    (data_dir / "env.json").write_text(json.dumps(data.env, indent=1), encoding="utf-8")
