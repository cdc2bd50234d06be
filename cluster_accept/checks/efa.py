"""AWS EFA: what NCCL needs to reach the Elastic Fabric Adapters, on every node that has them.

NCCL speaks to EFA only through the aws-ofi-nccl plugin (``libnccl-net*.so``) over libfabric's ``efa`` provider.
When the plugin is not where NCCL's loader looks (``NCCL_NET_PLUGIN``, ``LD_LIBRARY_PATH``, ``/opt/amazon/ofi-
nccl/lib``), NCCL falls back to ``NET/Socket`` without an error, at a few percent of the fabric (seeds 003, 004:
``NET/Libfabric/GDRDMA`` against ``SHM``/sockets decided a 2x difference). ``FI_PROVIDER`` naming another provider
(``tcp``, ``sockets``) does the same inside libfabric, and ``FI_EFA_USE_DEVICE_RDMA=0`` turns off the RDMA reads
p4d and later instances have. The number of EFA devices is the instance type's (AWS's documentation: p4d and
p4de 4, p5 32, p5e 32, p5en 16); a device fewer is a node that lost an adapter.

The adapters' error counters (``ports/1/hw_counters``: receive drops, RDMA read and write errors, retransmits,
retransmit timeouts, unresponsive and impaired remote connections) are kept with the node's run, one
``C|<device>/1|<counter>|<value>`` line each; preflight flags those that grew since the node's previous run.

Node-side: sh, cat, ls, readlink; ``fi_info`` where libfabric installed it. Nodes without EFA get one skip row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cluster_accept.checks._rdma import counter_line
from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    Profile,
    Reason,
    Status,
    dead,
    declare,
    error_row,
    fault,
    healthy,
)
from cluster_accept.vocabulary.text import quote

NAME = "efa"
_END = "### end"
_FIELDS = ("devices", "instance", "fi_info", "plugin", "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "NCCL_TOPO_FILE")
# The EFA driver's port statistics that count trouble (drivers/infiniband/hw/efa/efa_verbs.c).
HW_COUNTERS = (
    "rx_drops",
    "rdma_read_wr_err",
    "rdma_write_wr_err",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)
COMMAND = (
    's="${CLUSTER_ACCEPT_SYSFS:-/sys}"; n=0; '
    'for d in "$s"/class/infiniband/*; do v=$(readlink "$d/device/driver" 2>/dev/null); '
    '[ "${v##*/}" = efa ] || continue; n=$((n + 1)); '
    f"for c in {' '.join(HW_COUNTERS)}; do "
    'f="$d/ports/1/hw_counters/$c"; [ -r "$f" ] || continue; v=; { IFS= read -r v < "$f"; } 2>/dev/null; '
    'echo "C|${d##*/}/1|$c|$v"; done; '
    'done; echo "devices=$n"; '
    'echo "instance=$(cat "$s/devices/virtual/dmi/id/product_name" 2>/dev/null)"; '
    "if ! command -v fi_info > /dev/null 2>&1; then echo fi_info=missing; "
    "elif fi_info -p efa > /dev/null 2>&1; then echo fi_info=efa; else echo fi_info=no_efa; fi; "
    'p=; for dir in "${NCCL_NET_PLUGIN%/*}" $(echo "${LD_LIBRARY_PATH-}" | tr : " ") /opt/amazon/ofi-nccl/lib '
    "/opt/amazon/ofi-nccl/lib64 /opt/aws-ofi-nccl/lib /usr/local/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do "
    '[ -n "$p" ] && break; for f in "$dir"/libnccl-net*.so; do [ -e "$f" ] && p=$f && break; done; done; '
    'echo "plugin=$p"; echo "FI_PROVIDER=${FI_PROVIDER-<unset>}"; '
    'echo "FI_EFA_USE_DEVICE_RDMA=${FI_EFA_USE_DEVICE_RDMA-<unset>}"; '
    't=${NCCL_TOPO_FILE-}; [ -n "$t" ] && { [ -r "$t" ] && t="$t (readable)" || t="$t (missing)"; }; '
    f"echo \"NCCL_TOPO_FILE=$t\"; echo '{_END}'"
)
UNSET = "<unset>"
# EFA devices per instance type, from AWS's documentation (instance types with EFA, "Maximum EFA interfaces").
EFA_DEVICES = {
    "p4d.24xlarge": 4,
    "p4de.24xlarge": 4,
    "p5.48xlarge": 32,
    "p5e.48xlarge": 32,
    "p5en.48xlarge": 16,
    "p6-b200.48xlarge": 8,
}
# Instance families whose EFA does RDMA reads (p6 types are named p6-b200, p6e-gb200).
_RDMA_READ = re.compile(r"^(p4d|p4de|p5|p5e|p5en|p6(e)?(-[a-z0-9]+)?|trn1|trn1n|trn2)\.")
REASONS = declare(
    Reason("no_efa", Status.SKIP, "the node has no EFA device"),
    Reason(
        "plugin_missing",
        Status.FAIL,
        "no aws-ofi-nccl plugin (libnccl-net*.so) where NCCL looks (NCCL_NET_PLUGIN, LD_LIBRARY_PATH, "
        "/opt/amazon/ofi-nccl/lib): NCCL falls back to sockets between nodes; install it or add its lib to "
        "LD_LIBRARY_PATH",
        Action.FIX_CONFIG,
    ),
    Reason(
        "provider_missing",
        Status.FAIL,
        "libfabric's efa provider is not available (fi_info -p efa fails or fi_info is missing): install the EFA "
        "software (aws-efa-installer)",
        Action.FIX_CONFIG,
    ),
    Reason(
        "provider_forced",
        Status.FAIL,
        "FI_PROVIDER names another libfabric provider than efa: traffic leaves the adapters; unset it",
        Action.FIX_CONFIG,
    ),
    Reason(
        "device_rdma_off",
        Status.FAIL,
        "FI_EFA_USE_DEVICE_RDMA=0 on an instance whose EFA does RDMA reads: GPUDirect is off; unset it",
        Action.FIX_CONFIG,
    ),
    Reason(
        "devices_missing",
        Status.FAIL,
        "fewer EFA devices than the instance type has: an adapter is lost; stop and start the instance, or replace it",
        Action.CHECK_NODE,
    ),
    Reason(
        "topo_file_missing",
        Status.FAIL,
        "NCCL_TOPO_FILE names a file that is not there: NCCL fails or ignores the topology; fix the path",
        Action.FIX_CONFIG,
    ),
)


@dataclass(frozen=True)
class EfaState:
    values: dict[str, str] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)  # efa_0/1.rx_drops -> value
    error: str | None = None
    raw: str = ""

    @property
    def devices(self) -> int:
        return int(self.values.get("devices", "0"))


def parse(stdout: str, exit_code: int | None = 0) -> EfaState:
    lines = stdout.splitlines()
    if _END not in lines:
        return EfaState(error="output truncated before the end marker", raw=stdout)
    body = lines[: lines.index(_END)]
    values = dict(line.split("=", 1) for line in body if "=" in line and not line.startswith("C|"))
    missing = [key for key in _FIELDS if key not in values]
    if missing or not re.fullmatch("[0-9]{1,4}", values.get("devices", "")):
        said = f"missing {', '.join(missing)}" if missing else f"devices={quote(values['devices'])}"
        return EfaState(error=f"unexpected EFA output: {said}", raw=stdout)
    counted: dict[str, int] = {}
    for line in (line for line in body if line.startswith("C|")):
        read = counter_line(line, HW_COUNTERS)
        if read is None:
            return EfaState(error=f"unexpected EFA counter line {quote(line)}", raw=stdout)
        counted[read[0]] = read[1]
    return EfaState(values, counted, raw=stdout)


def counters(model: EfaState) -> dict[str, int]:
    """``efa_0/1.retrans_pkts``: preflight flags each that grew since the node's previous run."""
    return {} if model.error else dict(model.counters)


def _findings(state: EfaState) -> list[CheckRow]:
    v, rows = state.values, []
    if not v["plugin"]:
        rows.append(CheckRow(NAME, "aws-ofi-nccl", Status.FAIL, "plugin_missing", "not found", "libnccl-net*.so"))
    if v["fi_info"] != "efa":
        rows.append(CheckRow(NAME, "libfabric", Status.FAIL, "provider_missing", v["fi_info"], "efa provider"))
    if v["FI_PROVIDER"] not in (UNSET, "efa"):
        rows.append(CheckRow(NAME, "FI_PROVIDER", Status.FAIL, "provider_forced", v["FI_PROVIDER"], "efa or unset"))
    if v["FI_EFA_USE_DEVICE_RDMA"] == "0" and _RDMA_READ.match(v["instance"]):
        said = f"{v['instance']} does RDMA reads"
        row = CheckRow(NAME, "FI_EFA_USE_DEVICE_RDMA", Status.FAIL, "device_rdma_off", "0", "1 or unset", said)
        rows.append(row)
    expected = EFA_DEVICES.get(v["instance"])
    if expected is not None and state.devices < expected:
        said = f"{v['instance']} has {expected} EFA devices"
        rows.append(CheckRow(NAME, "devices", Status.FAIL, "devices_missing", str(state.devices), str(expected), said))
    if v["NCCL_TOPO_FILE"].endswith("(missing)"):
        topo = v["NCCL_TOPO_FILE"]
        rows.append(CheckRow(NAME, "NCCL_TOPO_FILE", Status.FAIL, "topo_file_missing", topo, "a readable file"))
    return rows


def evaluate(model: EfaState, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if model.devices == 0:
        return [CheckRow(NAME, "devices", Status.SKIP, "no_efa", "0", None)]
    found = _findings(model)
    if found:
        return found
    v = model.values
    said = f"plugin {v['plugin']}, libfabric efa provider, instance {v['instance'] or 'not read'}"
    return [CheckRow(NAME, "devices", Status.PASS, "ok", str(model.devices), None, said)]


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    counters=counters,
    environment=True,
    samples=(
        healthy("healthy", {"ok"}, fixture="efa/p5_healthy.txt"),
        fault("devices_missing", {"devices_missing"}, fixture="efa/devices_missing.txt"),
        dead("tools_missing", {"no_efa"}, fixture="efa/tools_missing.txt"),
    ),
)
