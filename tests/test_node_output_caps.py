"""Node output is capped where it enters the controller, before any parser reads it, and the cut is said: a
node's 30 MB sysfs file is not stored whole. The caps keep every real capture whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.inventory.model import DEFAULT_SSH, Node, Profile
from cluster_accept.remote import batch, detached, srun
from cluster_accept.remote.batch import parse_batch
from cluster_accept.remote.detached import parse_poll
from cluster_accept.remote.result import RemoteCommand
from cluster_accept.remote.srun_script import TaskOutput

CHECK_CAP = 4 * 1024 * 1024
NONCE = "0123456789abcdef"
CAPTURES = Path(__file__).resolve().parent.parent / "cluster_accept" / "testbed" / "captures"


def _framed(out: str, err: str = "") -> tuple[str, str]:
    return (
        f"@@CA:{NONCE}:0:out\n{out}\n@@CA:{NONCE}:0:end:0\n",
        f"@@CA:{NONCE}:0:err\n{err}\n@@CA:{NONCE}:0:errend\n",
    )


def test_a_checks_30_mb_output_is_cut_to_its_first_4_mib_saying_so() -> None:
    sysfs = "0123456789abcdef\n" * (30_000_000 // 17)
    stdout, stderr = _framed(sysfs, "TOKEN=hidden " + "e" * 5_000_000)
    (result,) = parse_batch([RemoteCommand("pcie", "cat /sys/x", reads_only=True)], stdout, stderr, NONCE)
    note = f"\n… [truncated: kept the first {CHECK_CAP:,} of {len(sysfs):,} characters]"
    assert result.stdout == sysfs[:CHECK_CAP] + note
    # masked before the cut (the value ran past it), the cut said all the same
    assert result.stderr == f"TOKEN=***\n… [truncated: kept the first {CHECK_CAP:,} of 5,000,013 characters]"


def test_a_probe_keeps_more_than_a_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "PROBE_OUTPUT_CHARS", 100, raising=False)
    stdout, stderr = _framed("x" * 1000)
    probe, check = parse_batch(
        [RemoteCommand("gemm", "run"), RemoteCommand("c", "cat", reads_only=True)],
        stdout + stdout.replace(":0:", ":1:"),
        stderr + stderr.replace(":0:", ":1:"),
        NONCE,
    )
    assert probe.stdout == "x" * 100 + "\n… [truncated: kept the first 100 of 1,000 characters]"
    assert check.stdout == "x" * 1000


def test_a_poll_and_an_srun_task_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detached, "PROBE_OUTPUT_CHARS", 100, raising=False)
    monkeypatch.setattr(batch, "PROBE_OUTPUT_CHARS", 100, raising=False)
    polled = parse_poll(0, "ended 0\n" + "y" * 1000, "z" * 300)
    assert polled is not None
    assert polled.stdout == "y" * 100 + "\n… [truncated: kept the first 100 of 1,000 characters]"
    assert polled.stderr == "z" * 100 + "\n… [truncated: kept the first 100 of 300 characters]"
    node = Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=Profile(), address="10.0.0.1")
    rank = srun._task_run(
        node, RemoteCommand("rank", "run", timeout_s=60), TaskOutput(0, "n1", ["w" * 999], 0), False, 1
    )
    assert rank.result is not None
    assert rank.result.stdout == "w" * 100 + "\n… [truncated: kept the first 100 of 1,000 characters]"


def test_every_real_capture_enters_whole() -> None:
    files = sorted(p for p in CAPTURES.rglob("*") if p.is_file())
    assert len(files) > 50
    for path in files:
        text = path.read_text(errors="replace")
        stdout, _ = _framed(text)
        (result,) = parse_batch([RemoteCommand("c", "cat", reads_only=True)], stdout, "", NONCE)
        assert "[truncated:" not in result.stdout, path


@pytest.mark.integration
def test_a_node_checking_itself_caps_a_checks_output() -> None:
    from cluster_accept.remote.session import LocalSession

    command = RemoteCommand("pcie", "head -c 5000000 /dev/zero | tr '\\0' a", reads_only=True)
    result = LocalSession._read(command, 60.0)
    assert result.stdout == "a" * CHECK_CAP + f"\n… [truncated: kept the first {CHECK_CAP:,} of 5,000,000 characters]"


def test_a_failed_port_pick_is_masked_and_cut() -> None:
    from cluster_accept.remote.detached import START_ERROR_CHARS
    from cluster_accept.remote.result import NoAnswer
    from cluster_accept.remote.shell import ShellSession

    class Answering(ShellSession):
        def run_script(self, script: str, timeout_s: float) -> tuple[int | None, str, str, bool]:
            return 1, "", "x" * 2_000_000 + "\nexport HF_TOKEN=hf_secret_value\nTraceback: no socket", False

        def put(self, local_path: str, remote_path: str) -> None:
            return None

    said = Answering().free_port("python3")
    assert isinstance(said, NoAnswer)
    assert said.why.startswith("could not pick a free port: [truncated: kept the last 500 of 2,000,0")
    assert said.why.endswith("x\nexport HF_TOKEN=***\nTraceback: no socket") and len(said.why) < 700
    assert START_ERROR_CHARS == 500
