"""Kernel log lines a job's user can write cannot pass for the driver's: any process sets its own name
(``prctl(PR_SET_NAME)``, 15 characters) and the kernel starts its segfault line with that name, unprivileged. A
name of ``NVRM: Xid ():79`` or ``SXid`` is no XID, in the xid check (its node-side filter and its parser) and in
the burn's node-side read of the log; the driver's own lines, in every form the tools print them, still are. A
mark read back from the history or a node's marks file (anyone with the file may edit it) never passes a
hardware XID as seen before."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import cluster_accept.checks.xid as xid
from cluster_accept.analysis.verdicts import marks_by_node
from cluster_accept.checks.base import Status
from cluster_accept.checks.samples import SAMPLES_DIR
from cluster_accept.inventory.model import DEFAULT_SSH, Inventory, Node, Profile
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.tasks.preflight.check_batch import NodePreflight
from cluster_accept.tasks.preflight.evaluate import evaluate_preflight, since_previous
from cluster_accept.vocabulary.rows import NodeValue
from tests.capture import NO_CLUSTER

PROFILE = Profile()
BOOT = "6c1f0c4e-5b7a-4a53-9d1e-0f0e4b2f3a10"
REPO = Path(__file__).resolve().parents[1]
FIXTURE = SAMPLES_DIR / "xid" / "xids.txt"  # real XID lines, as journalctl answered them

# A process that named itself 'NVRM: Xid ():79' (or 'SXid') and crashed: what the kernel logs for it.
FORGED_XID = "[ 4242.123456] NVRM: Xid ():79[4242]: segfault at 0 ip 0000 sp 0000 error 4 in a.out[...]"
FORGED_SXID = "[ 4243.000001] SXid[4243]: segfault at 0 ip 0000 sp 0000 error 4 in a.out[...]"
FORGED = [
    FORGED_XID,
    FORGED_SXID,
    "[ 4244.000001] host-1 kernel: NVRM: Xid ():79[4244]: segfault at 0 ip 0000 sp 0000 error 4",  # journalctl
    "Nov 21 16:47:01 host-1 kernel: NVRM: Xid ():79[4245]: segfault at 0 ip 0000 sp 0000 error 4",  # its short form
    "[ 4246.000001] nvidia-nvswitch[4246]: segfault at 0 ip 0000 sp 0000 error 4",
    "[ 4247.000001] NVRM: Xid (0):7[4247]: segfault at 0 ip 0000 sp 0000 error 4",  # the name's most a code can be
    "[ 4248.000001] traps: NVRM: Xid ():79[4248] general protection fault ip:0 sp:0 error:0",
    '[ 4249.000001] audit: type=1326 comm="NVRM: Xid (PCI:" exe="/tmp/NVRM: Xid (PCI:0000:18:00): 79, x" sig=31',
    # a message's further line, indented by dmesg: text inside one message never starts a line of its own
    "               NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=swapper/0, GPU has fallen off the bus.",
]
REAL_79 = "[ 1234.567890] NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=swapper/0, GPU has fallen off the bus."


def _framed(lines: list[str], uptime: str = "5000.25") -> str:
    """The check's output for a dmesg log of these lines, as its node-side filter prints it (short logs)."""
    body = "[    0.000000] Linux version 6.8.0\n" + "".join(line + "\n" for line in lines)
    count = body.count("\n")
    return (
        f"### boot={BOOT}\n### uptime={uptime}\n### source=dmesg\n{body}### rc=0\n"
        f"### lines={count} xid={count - 1}\n### done\n"
    )


def _rows(model: xid.KernelLog) -> list[tuple[str, str, str]]:
    return [(r.item, r.status.value, r.reason) for r in xid.evaluate(model, PROFILE, NO_CLUSTER)]


@pytest.mark.parametrize("line", FORGED, ids=range(len(FORGED)))
def test_a_process_named_like_an_xid_that_crashes_is_no_xid(line: str) -> None:
    model = xid.parse(_framed([line]), 0)
    assert (model.events, model.sxids, model.unparsed) == ([], [], [])
    assert _rows(model) == [("kernel_log", "pass", "ok")]


def test_the_drivers_own_lines_are_still_read_beside_forged_ones() -> None:
    captured = xid.parse(FIXTURE.read_text(), 0)  # the captured sample: XID 48, XID 43 and a garbled line
    assert [e.code for e in captured.events] == [48, 43]
    assert captured.unparsed == ["[ 1357.067890] NVRM: Xid (PCI:0000:2a:00): garbled"]
    real = [
        REAL_79,
        "[ 1300.000001] gpu-a17 kernel: NVRM: Xid (PCI:0000:19:00): 48, pid=7, name=python3, DBE",  # journalctl
        "[ 1301.000001] [  T4242] NVRM: Xid (PCI:0000:1a:00): 13, pid=7, name=python3, Graphics Exception",  # caller
        "[ 1302.000001] nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up",
        "[ 1303.000001] NVRM: Xid (PCI:0000:1b:00): garbled",
    ]
    model = xid.parse(_framed(FORGED + real), 0)
    assert [(e.code, e.pci) for e in model.events] == [(79, "0000:18:00"), (48, "0000:19:00"), (13, "0000:1a:00")]
    assert [(e.code, e.severity) for e in model.sxids] == [(20034, "Fatal")]
    assert model.unparsed == ["[ 1303.000001] NVRM: Xid (PCI:0000:1b:00): garbled"]


def _fake_dmesg(bin_dir: Path, log: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "dmesg.out").write_text(log)
    (bin_dir / "dmesg").write_text(f"#!/bin/sh\ncat '{bin_dir / 'dmesg.out'}'\n")
    (bin_dir / "dmesg").chmod(0o755)


@pytest.mark.integration
def test_a_flood_of_forged_lines_takes_no_place_of_a_real_xid_on_the_node(tmp_path: Path) -> None:
    """The node keeps the newest 1,000 XID lines of a kind: forged ones after a real XID 79 must not push it out,
    nor be counted as Xid lines."""
    forged = [FORGED_XID.replace("4242.123456", f"{2000 + i}.000001") for i in range(1001)]
    _fake_dmesg(tmp_path, "[    0.000000] Linux version 6.8.0\n" + "\n".join([REAL_79, *forged]) + "\n")
    done = subprocess.run(["sh", "-c", xid.COMMAND], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})  # fmt: skip
    model = xid.parse(done.stdout, done.returncode)
    assert [(e.code, e.line) for e in model.events] == [(79, REAL_79)]
    assert (model.reads[0].xid_lines, model.unparsed) == (1, [])
    assert _rows(model) == [("xid_79", "fail", "xid_79")]


# --- a forged mark --------------------------------------------------------------------------------------------

SXID_FATAL = "[ 2210.104412] nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 51 LTSSM Fault Up"


@pytest.mark.parametrize(
    ("line", "item", "reason"),
    [(REAL_79, "xid_79", "xid_79"), (SXID_FATAL, "sxid_20034", "sxid_fatal")],
    ids=["xid_79", "sxid_fatal"],
)
def test_a_mark_past_a_hardware_event_never_passes_it_as_seen_before(line: str, item: str, reason: str) -> None:
    """No run writes a mark past a hardware event of its boot (``marks`` stops before it): a mark a second before
    this read's uptime was written by hand, and the event fails as it did."""
    model = xid.since(xid.parse(_framed([line], uptime="3000.25"), 0), {"boot_id": BOOT, "uptime_s": "2999.25"})
    assert model.earlier == []
    rows = xid.evaluate(model, PROFILE, NO_CLUSTER)
    assert [(r.item, r.status, r.reason) for r in rows] == [(item, Status.FAIL, reason)]
    assert "judged again: a mark never passes a hardware event" in rows[0].detail
    assert xid.marks(model) == {"boot_id": BOOT}  # the next read judges it again too


def test_a_forged_mark_in_the_history_does_not_pass_a_real_xid_79() -> None:
    """The mark as a run reads it back from the history's ``node_values`` (``mark:`` keys)."""
    stdout = _framed([REAL_79], uptime="3000.25")
    outcome = NodePreflight("node01", NodeResult("node01", NodeStatus.OK, commands=[
        CommandResult("xid", 0, stdout, "")]), {"xid": xid.parse(stdout, 0)})  # fmt: skip
    history = [
        NodeValue.from_record(
            {"run_id": "r0", "cluster": "c", "node": "node01", "check": "xid", "key": f"mark:{k}", "value": v}
        )  # fmt: skip
        for k, v in {"boot_id": BOOT, "uptime_s": "2999.250"}.items()
    ]
    since_previous([outcome], [xid.CHECK], marks_by_node(history))
    inventory = Inventory("c", [Node("node01", DEFAULT_SSH, "p", PROFILE)], {"p": PROFILE}, "inventory.yaml", "d")
    rows = evaluate_preflight("r1", inventory, [outcome], [xid.CHECK])
    assert [(r.item, r.status.value, r.reason) for r in rows] == [("xid_79", "fail", "xid_79")]


# --- the burn's node-side read of the log ---------------------------------------------------------------------


def _node_burn(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The burn's node-side script as the node imports it (``gpu_bench`` shipped beside it)."""
    monkeypatch.syspath_prepend(str(REPO / "cluster_accept" / "probes" / "node"))
    spec = importlib.util.spec_from_file_location("node_burn", REPO / "cluster_accept/probes/burn/node/burn.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "node_burn", module)
    spec.loader.exec_module(module)
    return module


def test_the_burn_reads_only_the_drivers_xid_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    burn = _node_burn(monkeypatch)
    log = "\n".join(["[    0.000000] Linux version 6.8.0", *FORGED, REAL_79]) + "\n"

    def dmesg(args: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        assert args == ["dmesg"]
        return subprocess.CompletedProcess(args, 0, log, "")

    monkeypatch.setattr(burn.subprocess, "run", dmesg)
    assert burn.xid_lines() == ([REAL_79], "")
