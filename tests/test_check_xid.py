"""The xid check: its COMMAND run by ``sh`` against the test-bed's dmesg stand-in and against stand-in tools
that refuse (permission denied) or answer in journalctl's form, and its parser on hand-made outputs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import cluster_accept.checks.xid as xid
from cluster_accept.checks.base import Status
from cluster_accept.checks.reasons import Action
from cluster_accept.inventory.model import Profile
from cluster_accept.testbed.faults import Xid
from cluster_accept.testbed.nodedata import build_node, write_node_data, xid_line
from cluster_accept.testbed.standins import write_standins
from tests.capture import NO_CLUSTER

PROFILE = Profile()
DENIED = "dmesg: read kernel buffer failed: Operation not permitted\n"
JOURNAL_XID_48 = (
    "Nov 21 16:47:01 gpu-a17 kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=2231, name=python3, "
    "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 1.\n"
)
JOURNAL = (
    "Nov 21 16:40:12 gpu-a17 kernel: Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103)\n"
    "Nov 21 16:40:12 gpu-a17 kernel: Command line: BOOT_IMAGE=/boot/vmlinuz-6.8.0-49-generic ro\n"
    "Nov 21 16:40:19 gpu-a17 kernel: NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04\n"
)
JOURNAL_NO_ACCESS = (
    "Hint: You are currently not seeing messages from other users and the system.\n"
    "      Users in groups 'adm', 'systemd-journal' can see all messages.\n"
    "      Pass -q to turn off this notice.\n"
    "-- No entries --\n"
)


def rows_of(model: xid.KernelLog) -> list[tuple[str, str, str, str | None, str | None]]:
    return [
        (r.item, r.status.value, r.reason, r.observed, r.expected) for r in xid.evaluate(model, PROFILE, NO_CLUSTER)
    ]


def fake_tool(bin_dir: Path, name: str, stdout: str = "", stderr: str = "", rc: int = 0) -> None:
    """A stand-in ``name`` printing ``stdout``/``stderr`` and exiting ``rc``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / f"{name}.out").write_text(stdout)
    (bin_dir / f"{name}.err").write_text(stderr)
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\ncat '{bin_dir / name}.out'\ncat '{bin_dir / name}.err' >&2\nexit {rc}\n")
    script.chmod(0o755)


def run_command(*bin_dirs: Path) -> tuple[str, int]:
    """The check's COMMAND as the batch runs it (``sh -c``), the given bin dirs first on PATH."""
    path = ":".join([*(str(b) for b in bin_dirs), "/usr/bin", "/bin"])
    proc = subprocess.run(
        ["sh", "-c", xid.COMMAND], capture_output=True, text=True, env={"PATH": path}, timeout=60, check=False
    )
    return proc.stdout, proc.returncode


def _testbed_node_bin(tmp_path: Path, faults: list[Xid]) -> Path:
    """A test-bed node's bin dir (its dmesg stand-in) with ``faults`` planted, as ``up`` builds it."""
    write_node_data(build_node("h200x4", faults, {"NCCL_SOCKET_IFNAME": "eth0"}), tmp_path / "data", seed="n")
    write_standins(tmp_path / "bin", tmp_path / "data")
    return tmp_path / "bin"


def framed(source: str, log: str, rc: int) -> str:
    """One source section as the COMMAND's awk prints it, for logs of at most 8 plain lines plus Xid lines."""
    lines = [line for line in log.splitlines() if line.strip()]
    xids = sum("NVRM: Xid" in line for line in lines)
    body = "".join(line + "\n" for line in lines)
    return f"### source={source}\n{body}### rc={rc}\n### lines={len(lines)} xid={xids}\n"


@pytest.mark.integration
def test_testbed_xid_79_through_the_dmesg_standin(tmp_path: Path) -> None:
    node_bin = _testbed_node_bin(tmp_path, [Xid(code=79, gpu=1, at_s=1234.56789)])
    fake_tool(tmp_path / "fake", "journalctl", "Nov 21 00:00:00 x kernel: must not be asked\n")
    stdout, code = run_command(node_bin, tmp_path / "fake")
    assert code == 0
    model = xid.parse(stdout, code)
    line = "[ 1234.567890] NVRM: Xid (PCI:0000:00:07): 79, pid=0, name=swapper/0, GPU has fallen off the bus."
    assert [r.name for r in model.reads] == ["dmesg"]
    assert (model.reads[0].rc, model.reads[0].lines, model.reads[0].xid_lines) == (0, 9, 1)
    assert model.source == "dmesg"
    said = "pid=0, name=swapper/0, GPU has fallen off the bus."
    assert model.events == [xid.XidEvent(79, "0000:00:07", said, line, at_s=1234.56789)]
    rows = xid.evaluate(model, PROFILE, NO_CLUSTER)
    assert rows_of(model) == [("xid_79", "fail", "xid_79", "1 event on PCI 0000:00:07", "0 XID events")]
    assert rows[0].gpu is None
    assert rows[0].detail == f"XID 79: GPU has fallen off the bus; since boot, from dmesg\n{line}"


@pytest.mark.integration
def test_healthy_testbed_node_passes_with_zero_events(tmp_path: Path) -> None:
    node_bin = _testbed_node_bin(tmp_path, [])
    fake_tool(tmp_path / "fake", "journalctl", "Nov 21 00:00:00 x kernel: must not be asked\n")
    model = xid.parse(*run_command(node_bin, tmp_path / "fake"))
    assert [(r.name, r.rc, r.lines, r.xid_lines) for r in model.reads] == [("dmesg", 0, 8, 0)]
    assert model.reads[0].shown[0].startswith("[    0.000000] Linux version ")
    assert rows_of(model) == [("kernel_log", "pass", "ok", "0 XID events", "0 XID events")]
    assert xid.evaluate(model, PROFILE, NO_CLUSTER)[0].detail == "read with dmesg, since boot; 0 SXID events"
    assert model.boot_id and model.uptime_s and xid.marks(model) == {"boot_id": model.boot_id,
                                                                     "uptime_s": f"{model.uptime_s:.3f}"}  # fmt: skip


def test_several_codes_one_row_each_application_ones_fail_beside_a_hardware_xid() -> None:
    data = build_node("h200x4", [], {})
    faults = [Xid(code=79, gpu=1), Xid(code=43, gpu=2), Xid(code=79, gpu=0), Xid(code=48, gpu=3), Xid(code=45)]
    log = data.dmesg + "".join(xid_line(data, f, i) for i, f in enumerate(faults))
    model = xid.parse(framed("dmesg", log, 0) + "### done\n", 0)
    assert [e.code for e in model.events] == [79, 43, 79, 48, 45]
    assert rows_of(model) == [
        ("xid_43", "fail", "xid_app_with_hardware", "1 event on PCI 0000:00:08", "0 XID events"),
        ("xid_45", "fail", "xid_app_with_hardware", "1 event on PCI 0000:00:06", "0 XID events"),
        ("xid_48", "fail", "xid_48", "1 event on PCI 0000:00:09", "0 XID events"),
        ("xid_79", "fail", "xid_79", "2 events on PCI 0000:00:06, 0000:00:07", "0 XID events"),
    ]
    details = [r.detail.splitlines()[0] for r in xid.evaluate(model, PROFILE, NO_CLUSTER)]
    with_hardware = "with XID 48, XID 79 in the last 24 h: not the application's alone"
    assert details == [
        f"XID 43: GPU stopped processing (commonly follows a killed job); since boot, from dmesg; {with_hardware}",
        f"XID 45: preemptive cleanup (commonly follows a killed job); since boot, from dmesg; {with_hardware}",
        "XID 48: double-bit ECC error; since boot, from dmesg",
        "XID 79: GPU has fallen off the bus; since boot, from dmesg",
    ]


@pytest.mark.integration
def test_permission_denied_dmesg_falls_back_to_journalctl(tmp_path: Path) -> None:
    fake_tool(tmp_path, "dmesg", stderr=DENIED, rc=1)
    fake_tool(tmp_path, "journalctl", JOURNAL + JOURNAL_XID_48)
    stdout, code = run_command(tmp_path)
    _, _, body = stdout.partition("\n### uptime=")  # the boot and uptime come first
    assert body.partition("\n")[2].startswith(
        f"### source=dmesg\n{DENIED}### rc=1\n### lines=1 xid=0\n### source=journalctl\n"
    )
    model = xid.parse(stdout, code)
    assert [(r.name, r.rc, r.lines, r.xid_lines) for r in model.reads] == [("dmesg", 1, 1, 0), ("journalctl", 0, 4, 1)]
    assert model.source == "journalctl"
    assert [(e.code, e.pci) for e in model.events] == [(48, "0000:18:00")]
    assert model.events[0].text.startswith("pid=2231, name=python3, An uncorrectable double bit error")
    assert rows_of(model) == [("xid_48", "fail", "xid_48", "1 event on PCI 0000:18:00", "0 XID events")]
    assert JOURNAL_XID_48.strip() in xid.evaluate(model, PROFILE, NO_CLUSTER)[0].detail


@pytest.mark.integration
def test_empty_dmesg_falls_back_and_a_clean_journal_passes(tmp_path: Path) -> None:
    fake_tool(tmp_path, "dmesg", "", rc=0)
    fake_tool(tmp_path, "journalctl", JOURNAL)
    model = xid.parse(*run_command(tmp_path))
    assert [(r.name, r.rc, r.lines) for r in model.reads] == [("dmesg", 0, 0), ("journalctl", 0, 3)]
    assert rows_of(model) == [("kernel_log", "pass", "ok", "0 XID events", "0 XID events")]
    assert xid.evaluate(model, PROFILE, NO_CLUSTER)[0].detail == "read with journalctl, since boot; 0 SXID events"


@pytest.mark.integration
@pytest.mark.parametrize(
    "journal, journal_rc, said",
    [
        (JOURNAL_NO_ACCESS, 0, "journalctl rc=0, 4 lines: Hint: You are currently not seeing messages"),
        ("No journal files were found.\n-- No entries --\n", 0, "journalctl rc=0, 2 lines: No journal files were"),
        ("", 0, "journalctl rc=0, 0 lines"),
        ("Failed to get journal: Permission denied\n", 1, "journalctl rc=1, 1 line: Failed to get journal"),
    ],
)
def test_unreadable_kernel_log_is_a_skip_never_a_pass(tmp_path: Path, journal: str, journal_rc: int, said: str) -> None:
    fake_tool(tmp_path, "dmesg", stderr=DENIED, rc=1)
    fake_tool(tmp_path, "journalctl", journal, rc=journal_rc)
    model = xid.parse(*run_command(tmp_path))
    assert model.source is None and model.events == []
    assert rows_of(model) == [("kernel_log", "skip", "kernel_log_unreadable", None, "readable kernel log")]
    detail = xid.evaluate(model, PROFILE, NO_CLUSTER)[0].detail
    assert detail.startswith(
        "neither dmesg nor journalctl could be read: "
        "dmesg rc=1, 1 line: dmesg: read kernel buffer failed: Operation not permitted / "
    )
    assert said in detail


def test_missing_journalctl_is_unreadable() -> None:
    stdout = framed("dmesg", DENIED, 1) + framed("journalctl", "sh: 1: journalctl: not found\n", 127) + "### done\n"
    assert rows_of(xid.parse(stdout, 0)) == [
        ("kernel_log", "skip", "kernel_log_unreadable", None, "readable kernel log")
    ]


@pytest.mark.integration
def test_xid_lines_beyond_the_cap_are_counted(tmp_path: Path) -> None:
    data = build_node("h200x4", [], {})
    log = data.dmesg + "".join(xid_line(data, Xid(code=13, gpu=i % 4), i) for i in range(1500))
    fake_tool(tmp_path, "dmesg", log)
    fake_tool(tmp_path, "journalctl", JOURNAL)
    model = xid.parse(*run_command(tmp_path))
    assert (len(model.events), model.xid_lines, model.reads[0].lines) == (1000, 1500, 1508)
    rows = xid.evaluate(model, PROFILE, NO_CLUSTER)
    assert [(r.item, r.status, r.observed) for r in rows] == [
        ("xid_13", Status.WARN, "1000 events on PCI 0000:00:06, 0000:00:07, 0000:00:08, 0000:00:09")
    ]
    assert rows[0].detail.startswith(
        "XID 13: graphics engine exception (usually the application's fault); since boot, from dmesg (1500 Xid lines "
        "in the log, 1000 read: the newest 1000 of the application's and of the others); the application's unless it "
        "repeats: bursts in the last 24 h: "
        "1 on PCI 0000:00:06, 1 on PCI 0000:00:07, 1 on PCI 0000:00:08, 1 on PCI 0000:00:09 (at most 5)\n"
    )


@pytest.mark.integration
def test_a_hardware_xid_after_a_log_full_of_one_jobs_xids_is_read(tmp_path: Path) -> None:
    """The node keeps the newest Xid lines past its cap: a job's thousands of XID 13 lines must not hide the XID 79
    logged after them (the events new since the previous run are the last ones)."""
    data = build_node("h200x4", [], {})
    faults = [Xid(code=13, gpu=0)] * 1500 + [Xid(code=79, gpu=1)]
    log = data.dmesg + "".join(xid_line(data, fault, i) for i, fault in enumerate(faults))
    fake_tool(tmp_path, "dmesg", log)
    model = xid.parse(*run_command(tmp_path))
    assert (len(model.events), model.xid_lines, model.events[-1].code) == (1001, 1501, 79)
    assert [(r.item, r.status, r.reason) for r in xid.evaluate(model, PROFILE, NO_CLUSTER)] == [
        ("xid_13", Status.FAIL, "xid_app_with_hardware"),
        ("xid_79", Status.FAIL, "xid_79"),
    ]


@pytest.mark.integration
def test_a_flood_of_application_xids_never_hides_an_earlier_hardware_xid(tmp_path: Path) -> None:
    """The node keeps non-application XIDs and SXIDs apart from its cap of application lines: XID 79 followed by
    1,001 lines of XID 13 is read with the newest 1,000 of them, in the log's order."""
    data = build_node("h200x4", [], {})
    faults = [Xid(code=79, gpu=1)] + [Xid(code=13, gpu=0)] * 1001
    log = data.dmesg + "".join(xid_line(data, fault, i) for i, fault in enumerate(faults))
    fake_tool(tmp_path, "dmesg", log)
    model = xid.parse(*run_command(tmp_path))
    codes = [e.code for e in model.events]
    assert (len(model.events), model.xid_lines, codes[0], codes.count(13)) == (1001, 1002, 79, 1000)
    assert [(r.item, r.status, r.reason) for r in xid.evaluate(model, PROFILE, NO_CLUSTER)] == [
        ("xid_13", Status.FAIL, "xid_app_with_hardware"),
        ("xid_79", Status.FAIL, "xid_79"),
    ]


def test_xid_line_without_a_code_is_not_ignored() -> None:
    log = "[    0.000000] Linux version 6.8.0\n[ 99.000001] NVRM: Xid (PCI:0000:00:07): garbled\n"
    model = xid.parse(framed("dmesg", log, 0) + "### done\n", 0)
    assert model.events == [] and model.unparsed == ["[ 99.000001] NVRM: Xid (PCI:0000:00:07): garbled"]
    assert rows_of(model) == [("xid_unparsed", "fail", "xid_unparsed", "1 line", "0 XID events")]


def test_unknown_code_and_old_format_without_pci_prefix() -> None:
    log = "[    0.000000] Linux version 5.4.0\n[ 12.5] NVRM: Xid (0000:3b:00): 157, GPU reported something new\n"
    model = xid.parse(framed("dmesg", log, 0) + "### done\n", 0)
    assert [(e.code, e.pci, e.text) for e in model.events] == [(157, "0000:3b:00", "GPU reported something new")]
    rows = xid.evaluate(model, PROFILE, NO_CLUSTER)
    assert rows_of(model) == [("xid_157", "fail", "xid_unlisted", "1 event on PCI 0000:3b:00", "0 XID events")]
    assert rows[0].detail.startswith("XID 157: see NVIDIA's XID catalogue; since boot, from dmesg\n")


GOOD = framed("dmesg", "[    0.000000] Linux version 6.8.0\n", 0) + "### done\n"


@pytest.mark.parametrize(
    "stdout",
    [
        "",
        "\x00\x7f#!garbage ~~~ 42\n",
        GOOD[: GOOD.index("### rc=")],  # cut inside the dmesg section
        GOOD[: GOOD.index("### done")],  # cut before the end marker
        "[ 1234.567890] NVRM: Xid (PCI:0000:00:07): 79, pid=0, name=swapper/0, GPU has fallen off the bus.\n",
        "### source=dmesg\n### source=journalctl\n### done\n",
        "### done\n",
    ],
)
def test_garbage_and_truncated_output_are_error_rows(stdout: str) -> None:
    model = xid.parse(stdout, 0)
    assert model.error is not None and model.raw == stdout
    rows = xid.evaluate(model, PROFILE, NO_CLUSTER)
    assert [(r.item, r.status, r.reason) for r in rows] == [("output", Status.ERROR, "unparsable_output")]
    assert stdout[:20] in rows[0].detail


def test_good_output_parses_without_error() -> None:
    model = xid.parse(GOOD, 0)
    assert model.error is None and model.source == "dmesg"


BOOT = "6c1f0c4e-5b7a-4a53-9d1e-0f0e4b2f3a10"
# SXID lines in the NVSwitch driver's form (Fabric Manager user guide): the first line of an error says whether
# it is fatal; the lines after it (engine, data) belong to it.
SXID_FATAL_LINES = (
    "[ 2210.104412] nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 51 LTSSM Fault Up\n"
    "[ 2210.104418] nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 20034, Severity 5 Engine instance 51 Sub-engine "
    "instance 00\n"
    "[ 2210.104421] nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 20034, Data {0x00000000, 0x00000000, 0x00000000}\n"
)
SXID_NONFATAL_LINE = (
    "[ 2305.551230] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV "
    "error (First)\n"
)


def _log(lines: str, boot: str = BOOT, uptime: str = "3000.25") -> xid.KernelLog:
    log = "[    0.000000] Linux version 6.8.0\n" + lines
    return xid.parse(f"### boot={boot}\n### uptime={uptime}\n" + framed("dmesg", log, 0) + "### done\n", 0)


def test_sxids_are_read_with_their_severity_one_event_per_error() -> None:
    model = _log(SXID_FATAL_LINES + SXID_NONFATAL_LINE)
    assert [(e.switch, e.code, e.severity, e.pci, e.at_s) for e in model.sxids] == [
        (2, 20034, "Fatal", "0000:86:00.0", 2210.104412),
        (0, 12028, "Non-fatal", "0000:05:00.0", 2305.55123),
    ]
    assert rows_of(model) == [
        ("sxid_12028", "warn", "sxid_nonfatal", "1 event (Non-fatal) on nvswitch0 (0000:05:00.0)", "0 SXID events"),
        ("sxid_20034", "fail", "sxid_fatal", "1 event (Fatal) on nvswitch2 (0000:86:00.0)", "0 SXID events"),
    ]
    declared = xid.REASONS["sxid_fatal"]
    assert declared.action == Action.REBOOT_NODE and "reboot the node" in declared.explanation


def test_only_events_after_the_previous_runs_read_of_the_same_boot_are_new() -> None:
    old = "[ 1234.567890] NVRM: Xid (PCI:0000:18:00): 43, pid=9, name=python3, Ch 00000010\n"
    new = "[ 2990.000001] NVRM: Xid (PCI:0000:19:00): 13, pid=7, name=python3, Graphics Exception\n"
    model = _log(old + SXID_NONFATAL_LINE + new)
    assert xid.marks(model) == {"boot_id": BOOT, "uptime_s": "3000.250"}  # no hardware event: read to the end

    cut = xid.since(model, {"boot_id": BOOT, "uptime_s": "2500.000"})  # the previous run read the log at 2500 s
    assert [e.code for e in cut.earlier] == [43, 12028] and [e.code for e in cut.events] == [13] and not cut.sxids
    assert rows_of(cut) == [
        ("xid_13", "warn", "xid_13", "1 event on PCI 0000:19:00", "0 XID events"),
        (
            "sxid_12028",
            "pass",
            "seen_before",
            "1 event, the last at 2306 s after boot",
            "none new since the previous run",
        ),
        ("xid_43", "pass", "seen_before", "1 event, the last at 1235 s after boot", "none new since the previous run"),
    ]
    (warned,) = [r for r in xid.evaluate(cut, PROFILE, NO_CLUSTER) if r.status is Status.WARN]
    assert warned.detail.startswith("XID 13: graphics engine exception (usually the application's fault); since the "
                                    "previous run (read at 2500 s after boot)")  # fmt: skip

    repaired = xid.since(_log(old), {"boot_id": BOOT, "uptime_s": "2500.000"})  # XID 43 judged last run: passes
    assert [r[1:3] for r in rows_of(repaired)] == [("pass", "ok"), ("pass", "seen_before")]


@pytest.mark.parametrize(
    ("previous", "why"),
    [
        ({"boot_id": "another-boot", "uptime_s": "2500.000"}, "rebooted since: every event is of this boot"),
        ({"boot_id": BOOT}, "no uptime kept"),
        ({}, "no previous run"),
    ],
)
def test_after_a_reboot_or_without_marks_every_event_since_boot_is_new(previous: dict[str, str], why: str) -> None:
    model = _log("[ 1234.5] NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=swapper/0, GPU has fallen off the bus.\n")
    assert rows_of(xid.since(model, previous))[0][1:3] == ("fail", "xid_79"), why


def test_a_line_without_a_stamp_is_new() -> None:
    model = _log("NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=swapper/0, GPU has fallen off the bus.\n")
    assert model.events[0].at_s is None
    assert rows_of(xid.since(model, {"boot_id": BOOT, "uptime_s": "9999.0"}))[0][1:3] == ("fail", "xid_79")


def test_xid_154_takes_the_recovery_action_its_line_names() -> None:
    reboot = _log("[ 12.5] NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
                  "(Node Reboot Required)\n")  # fmt: skip
    reset = _log("[ 12.5] NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
                 "(GPU Reset Required)\n")  # fmt: skip
    assert [r[2] for r in rows_of(reboot)] == ["xid_154_reboot"] and [r[2] for r in rows_of(reset)] == ["xid_154"]
    assert xid.REASONS["xid_154_reboot"].action == Action.REBOOT_NODE
    assert xid.REASONS["xid_154"].action == Action.RESET_GPU


def test_an_unreadable_log_keeps_no_marks() -> None:
    stdout = f"### boot={BOOT}\n### uptime=12.0\n" + framed("dmesg", DENIED, 1) + framed("journalctl", "x\n", 1)
    assert xid.marks(xid.parse(stdout + "### done\n", 0)) == {}


def _xid_13(at_s: float, pid: int = 4242, pci: str = "0000:18:00") -> str:
    """An XID 13 line as the driver logs it for a job's faulty kernel (one line per exception)."""
    return (
        f"[{at_s:12.6f}] NVRM: Xid (PCI:{pci}): 13, pid={pid}, name=python3, Graphics SM Warp Exception on "
        "(GPC 0, TPC 0, SM 0): Out Of Range Address\n"
    )


XID_79_LINE = "[ 1234.500000] NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=swapper/0, GPU has fallen off the bus.\n"


def test_an_application_xid_warns_on_its_own_and_is_judged_once() -> None:
    """NVIDIA's catalogue: XID 13 is usually the application's fault; one user's job must not drain the node."""
    model = _log(_xid_13(2000.5))
    assert rows_of(model) == [("xid_13", "warn", "xid_13", "1 event on PCI 0000:18:00", "0 XID events")]
    (row,) = xid.evaluate(model, PROFILE, NO_CLUSTER)
    assert row.detail.splitlines()[0] == (
        "XID 13: graphics engine exception (usually the application's fault); since boot, from dmesg; the "
        "application's unless it repeats: bursts in the last 24 h: 1 on PCI 0000:18:00 (at most 5)"
    )
    again = xid.since(_log(_xid_13(2000.5)), xid.marks(model))  # the next read, its marks kept: judged once
    assert rows_of(again) == [
        ("kernel_log", "pass", "ok", "0 XID events", "0 XID events"),
        ("xid_13", "pass", "seen_before", "1 event, the last at 2000 s after boot", "none new since the previous run"),
    ]


@pytest.mark.parametrize("hardware", [XID_79_LINE, SXID_FATAL_LINES], ids=["xid_79", "sxid_fatal"])
def test_a_hardware_event_fails_every_later_read_of_the_same_boot_until_a_reboot(hardware: str) -> None:
    """A check that failed the node may drain nothing (the controller out of reach) or run by hand: the next
    read must fail it again, so the mark never passes a hardware event; the application XID before it is judged
    once; another boot's log starts anew."""
    log = _xid_13(1000.0) + hardware + _xid_13(2500.0, pid=7)
    first = _log(log)
    item = "xid_79" if hardware == XID_79_LINE else "sxid_20034"
    failing = {("xid_13", "fail", "xid_app_with_hardware"), (item, "fail", item if item == "xid_79" else "sxid_fatal")}
    previous = xid.marks(first)
    for _ in range(3):
        again = xid.since(_log(log, uptime="3100.5"), previous)
        assert {r[:3] for r in rows_of(again) if r[1] == "fail"} == failing
        assert [e.at_s for e in again.earlier] == [1000.0]
        assert previous == {"boot_id": BOOT, "uptime_s": "1000.000"}  # the XID 13 before it: judged once
        previous = xid.marks(again)
    rebooted = xid.since(_log(_xid_13(50.0), boot="9d1e0f0e-0000-4000-8000-000000000001", uptime="60.0"), previous)
    assert [r[1:3] for r in rows_of(rebooted)] == [("warn", "xid_13")]


def test_the_mark_before_a_hardware_event_is_cut_down_never_rounded_past_it() -> None:
    first = _log("[ 1000.000600] NVRM: Xid (PCI:0000:18:00): 43, pid=1, name=python3, Ch 00000010\n"
                 "[ 1000.000900] NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=python3, DBE\n")  # fmt: skip
    assert xid.marks(first) == {"boot_id": BOOT, "uptime_s": "1000.000"}
    assert [r[1:3] for r in rows_of(xid.since(first, xid.marks(first))) if r[1] == "fail"] == [
        ("fail", "xid_app_with_hardware"),
        ("fail", "xid_48"),
    ]
    alone = _log("[ 1234.5] NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=python3, DBE\n")
    assert xid.marks(alone) == {"boot_id": BOOT}  # nothing judged before it: the next read starts at boot


def test_application_xids_fail_when_one_gpu_repeats_them_in_more_bursts_than_the_profile_allows() -> None:
    one_job = "".join(_xid_13(1000.0 + rank * 0.1, pid=100 + rank) for rank in range(8))  # 8 ranks: one burst
    assert rows_of(_log(one_job))[0][1:3] == ("warn", "xid_13")
    six_jobs = "".join(_xid_13(1000.0 + 100 * k, pid=100 + k) for k in range(6))  # 100 s apart: six bursts
    rows = xid.evaluate(_log(six_jobs), PROFILE, NO_CLUSTER)
    assert [(r.item, r.status, r.reason) for r in rows] == [("xid_13", Status.FAIL, "xid_app_repeated")]
    assert "; bursts in the last 24 h: 6 on PCI 0000:18:00, more than thresholds.app_xid_max (5)\n" in rows[0].detail
    assert xid.REASONS["xid_app_repeated"].action == Action.RESET_GPU

    looser = Profile.model_validate({"thresholds": {"app_xid_max": 6}})
    assert [r.reason for r in xid.evaluate(_log(six_jobs), looser, NO_CLUSTER)] == ["xid_13"]
    shorter = Profile.model_validate({"thresholds": {"app_xid_window_h": 0.5}})  # from 1200.25 s: 3 bursts
    assert [r.reason for r in xid.evaluate(_log(six_jobs), shorter, NO_CLUSTER)] == ["xid_13"]
    two_gpus = "".join(_xid_13(1000.0 + 100 * k, pci=("0000:18:00", "0000:19:00")[k % 2]) for k in range(6))
    assert [r.reason for r in xid.evaluate(_log(two_gpus), PROFILE, NO_CLUSTER)] == ["xid_13"]  # 3 bursts each

    killed = six_jobs.replace("): 13, ", "): 45, ")  # XID 45: logged for every job killed with work on the GPU
    (row,) = xid.evaluate(_log(killed), PROFILE, NO_CLUSTER)
    assert (row.reason, row.detail.splitlines()[0].split("dmesg; ")[1]) == (
        "xid_45",
        "logged for every job killed with work on the GPU: not counted as a repeat",
    )

    judged = xid.since(_log(six_jobs), {"boot_id": BOOT, "uptime_s": "1450.0"})  # five judged, the sixth is new
    assert [r[1:3] for r in rows_of(judged)] == [("fail", "xid_app_repeated"), ("pass", "seen_before")]


def test_an_application_xid_fails_in_the_window_of_a_hardware_xid_even_one_before_the_mark() -> None:
    dbe = "[ 1500.000000] NVRM: Xid (PCI:0000:19:00): 48, pid=7, name=python3, DBE\n"
    model = xid.since(_log(dbe + _xid_13(2900.0)), {"boot_id": BOOT, "uptime_s": "2000.0"})
    assert rows_of(model) == [
        ("xid_13", "fail", "xid_app_with_hardware", "1 event on PCI 0000:18:00", "0 XID events"),
        ("xid_48", "fail", "xid_48", "1 event on PCI 0000:19:00", "0 XID events"),
    ]
    assert "; with XID 48 in the last 24 h: not the application's alone\n" in xid.evaluate(
        model, PROFILE, NO_CLUSTER)[0].detail  # fmt: skip
    shorter = Profile.model_validate({"thresholds": {"app_xid_window_h": 0.25}})  # from 2100.25 s: the DBE is older
    assert xid.evaluate(model, shorter, NO_CLUSTER)[0].reason == "xid_13"
    assert rows_of(_log(SXID_FATAL_LINES + _xid_13(2900.0)))[0][:3] == ("xid_13", "fail", "xid_app_with_hardware")
    assert rows_of(_log(SXID_NONFATAL_LINE + _xid_13(2900.0)))[0][:3] == ("xid_13", "warn", "xid_13")


@pytest.mark.parametrize(
    ("uptime", "header", "problem"),
    [
        ("inf", "3000.25", "uptime_s='inf' is impossible"),
        ("nan", "3000.25", "uptime_s='nan' is impossible"),
        ("1e999", "3000.25", "uptime_s='1e999' is impossible"),
        ("-1.5", "3000.25", "uptime_s='-1.5' is impossible"),
        ("3000.3", "3000.25", "uptime_s='3000.3' is after this reading (3000.250): from the future"),
        ("1e12", "3000.25", "uptime_s='1e12' is after this reading (3000.250): from the future"),
        ("12 s", "3000.25", "uptime_s='12 s' is not a number"),
        ("2000", "", "uptime_s='2000' cannot be checked: this reading has no uptime_s of its own"),
    ],
)
def test_an_impossible_or_future_mark_is_named_and_never_passes_an_event(
    uptime: str, header: str, problem: str
) -> None:
    model = xid.since(_log(XID_79_LINE, uptime=header), {"boot_id": BOOT, "uptime_s": uptime})
    assert model.earlier == [] and model.since_s is None
    assert rows_of(model) == [
        ("xid_79", "fail", "xid_79", "1 event on PCI 0000:18:00", "0 XID events"),
        ("mark", "warn", "mark_impossible", problem, "a read of this boot at or before this read's uptime"),
    ]
    assert xid.evaluate(model, PROFILE, NO_CLUSTER)[0].detail.startswith(
        "XID 79: GPU has fallen off the bus; since boot"
    )
