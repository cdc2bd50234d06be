"""Suspects among a run's settings, and what measuring again without them proves (pure; the rows the stage
writes from them)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster_accept.analysis.suspects import (
    JobSetting,
    failing_figures,
    read_settings,
    suspects,
)
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.inventory.model import Node, Profile, SshSettings
from cluster_accept.probes import scripts
from cluster_accept.probes.node import job_settings
from cluster_accept.probes.scripts import REMOVED_SETTINGS, TOOL_KEYS, job_env

# What job_settings.py printed on a test-bed node (its sshd session's environment, the capture's env-nccl.txt)
# with ONEDNN_MAX_CPU_ISA planted in the environment and in /etc/nccl.conf.
LINE = "\n".join(
    json.dumps({"info": "settings", "setting": entry})
    for entry in (
        {"name": "CUDA_VERSION", "value": "13.0.2", "source": "env"},
        {"name": "NCCL_DEBUG", "value": "WARN", "source": "env"},
        {"name": "NCCL_IB_DISABLE", "value": "0", "source": "env"},
        {"name": "NCCL_SOCKET_IFNAME", "value": "eth0", "source": "env"},
        {"name": "ONEDNN_MAX_CPU_ISA", "value": "SSE41", "source": "env", "also": "/etc/nccl.conf"},
        {"name": "NCCL_P2P_LEVEL", "value": "LOC", "source": "/etc/nccl.conf"},
        {"name": "NCCL_DEBUG_SUBSYS", "value": "INIT,ENV", "source": "env"},
    )
)


def _profile(**probes: object) -> Profile:
    return Profile.model_validate({"nccl_env": {"NCCL_SOCKET_IFNAME": "eth0"}, "probes": probes})


def test_the_settings_line_is_read_from_the_runs_stderr_among_other_lines() -> None:
    found = read_settings(f"Warning: something\n{LINE}\n")
    assert [s.key for s in found][:2] == ["CUDA_VERSION", "NCCL_DEBUG"] and len(found) == 7
    isa = next(s for s in found if s.key == "ONEDNN_MAX_CPU_ISA")
    assert isa.where == "in the job environment and /etc/nccl.conf" and isa.removal() is None  # oneDNN read it first
    p2p = next(s for s in found if s.key == "NCCL_P2P_LEVEL")
    assert p2p.where == "in /etc/nccl.conf" and p2p.removal() == ""  # set empty: /etc/nccl.conf is always read
    assert read_settings('{"info": "settings", "settings": [{"key": ***') == []  # masked or cut: nothing


def test_suspects_leave_out_the_tools_own_the_pinned_the_defaults_and_what_healthy_nodes_ran_with() -> None:
    settings = read_settings(LINE)
    named = [s.key for s in suspects(settings, _profile(), TOOL_KEYS)]
    # NCCL_DEBUG: the tool sets it; NCCL_IB_DISABLE=0: NCCL's default; NCCL_SOCKET_IFNAME: pinned; CUDA_VERSION:
    # descriptive
    assert named == ["ONEDNN_MAX_CPU_ISA", "NCCL_P2P_LEVEL", "NCCL_DEBUG_SUBSYS"]
    healthy = [[JobSetting("NCCL_DEBUG_SUBSYS", "INIT,ENV", "env")]]
    assert [s.key for s in suspects(settings, _profile(), TOOL_KEYS, healthy)] == [
        "ONEDNN_MAX_CPU_ISA",
        "NCCL_P2P_LEVEL",
    ]
    other_value = [[JobSetting("NCCL_P2P_LEVEL", "NVL", "env")]]  # a peer with another value clears nothing
    assert "NCCL_P2P_LEVEL" in [s.key for s in suspects(settings, _profile(), TOOL_KEYS, other_value)]
    kept = _profile(kept_settings=["ONEDNN_MAX_CPU_ISA", "NCCL_DEBUG_SUBSYS"])
    assert [s.key for s in suspects(settings, kept, TOOL_KEYS)] == ["NCCL_P2P_LEVEL"]


def _row(node: str, item: str, status: Status, reason: str, observed: str = "2.62") -> NodeRow:
    return NodeRow("r", "c", "single-node", node, "gemm", item, status, reason, observed, ">= 45.9 GFLOP/s", "")


def test_failing_figures_are_the_failed_rows_of_figures_below_a_minimum_or_their_peers() -> None:
    rows = [
        _row("n1", "gemm_bf16_gflops_vs_cluster", Status.FAIL, "straggler"),
        _row("n1", "gemm_bf16_gflops", Status.PASS, "ok"),
        _row("n2", "gemm_bf16_gflops_vs_cluster", Status.WARN, "straggler_unconfirmed"),  # did not reproduce
        _row("n3", "mem_copy_gbps", Status.FAIL, "below_threshold"),
        _row("n3", "probe", Status.ERROR, "probe_failed"),
    ]
    found = failing_figures(rows, {"gemm_bf16_gflops", "mem_copy_gbps"})
    assert {n: [r.item for r in rs] for n, rs in found.items()} == {
        "n1": ["gemm_bf16_gflops_vs_cluster"],
        "n3": ["mem_copy_gbps"],
    }


def test_a_figure_is_recovered_only_beyond_the_margin_and_keys_that_cannot_be_removed_are_never_suspects() -> None:
    from cluster_accept.analysis.suspects import recovered

    assert recovered(280.0, 300.0, 5) and not recovered(280.0, 290.0, 5) and recovered(None, 1.0, 5)
    odd = [
        JobSetting("NCCL_X ", "1", "/etc/nccl.conf"),  # ``NCCL_X = 1``: a key NCCL never reads
        JobSetting("NCCL_X$(touch /tmp/x)", "1", "/etc/nccl.conf"),
        JobSetting("NCCL_NET", "Socket", "/etc/nccl.conf"),  # empty would load no network at all
        JobSetting("NCCL_NET", "IB", "env"),  # from the environment it can be unset
        JobSetting("CUBLAS_VERSION", "13.0.0", "env"),  # describes the image
        JobSetting("NCCL_PROTO", "LL", "/etc/nccl.conf"),
    ]
    found = suspects(odd, _profile(), TOOL_KEYS)
    assert [(s.key, s.source, s.removal()) for s in found] == [
        ("NCCL_NET", "env", None),
        ("NCCL_PROTO", "/etc/nccl.conf", "^"),
    ]


def test_a_run_measured_again_unsets_an_environment_setting_and_blanks_one_nccl_reads_from_a_file() -> None:
    node = Node("n1", SshSettings(), "p", Profile.model_validate({"probes": {"device": "cpu"}}))
    assert job_env(node, NCCL_DEBUG="INFO") == "env NCCL_DEBUG=INFO "
    token = REMOVED_SETTINGS.set({"ONEDNN_MAX_CPU_ISA": None, "NCCL_P2P_LEVEL": ""})
    try:
        assert job_env(node, NCCL_DEBUG="INFO") == "env -u ONEDNN_MAX_CPU_ISA NCCL_P2P_LEVEL='' NCCL_DEBUG=INFO "
        # the settings it says it runs with are those the run has: the prelude runs under the same changes
        prelude = scripts.settings_prelude(node)
        assert "env -u ONEDNN_MAX_CPU_ISA NCCL_P2P_LEVEL='' python3 job_settings.py" in prelude, prelude
    finally:
        REMOVED_SETTINGS.reset(token)


def _only_these_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, etc_text: str, conf_file: Path) -> Path:
    """The node-side script sees no library variable of this process, ``conf_file`` as NCCL_CONF_FILE and an
    /etc/nccl.conf holding ``etc_text``, whose path is returned."""
    etc = tmp_path / "etc.conf"
    etc.write_text(etc_text)
    monkeypatch.setattr(job_settings, "ETC_FILE", str(etc))
    for key in [k for k in os.environ if job_settings.watched(k)]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("NCCL_CONF_FILE", str(conf_file))
    return etc


def test_the_node_side_script_reads_nccls_files_in_nccls_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    user = tmp_path / "user.conf"
    user.write_text("# a comment\nNCCL_ALGO=Ring\nNCCL_PROTO=Simple\nNCCL_IB_TOKEN=abc\n")
    etc = _only_these_files(monkeypatch, tmp_path, "NCCL_ALGO=Tree\nNCCL_P2P_LEVEL=LOC\n", user)
    monkeypatch.setenv("NCCL_PROTO", "LL")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("HOME_OF_NOTHING", "x")  # not a library's: not read
    found = {s["name"]: s for s in job_settings.settings()}
    assert found["NCCL_PROTO"] == {"name": "NCCL_PROTO", "value": "LL", "source": "env", "also": str(user)}
    # the user file is read before /etc/nccl.conf, and the first to set a key wins
    assert found["NCCL_ALGO"] == {"name": "NCCL_ALGO", "value": "Ring", "source": str(user), "also": str(etc)}
    assert found["NCCL_P2P_LEVEL"]["source"] == str(etc) and found["NCCL_IB_TOKEN"]["value"] == "****"
    assert found["OMP_NUM_THREADS"]["value"] == "3" and "HOME_OF_NOTHING" not in found


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.symlink_to("/dev/zero"), "a link: not followed"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (
            lambda p: (p.write_text("NCCL_ALGO=Tree\n"), os.chown(p, 65534, 65534)),
            "owned by uid 65534, neither the reading user nor root",
        ),
    ],
    ids=["link-to-dev-zero", "fifo", "another-users-file"],
)
def test_the_node_side_script_never_follows_waits_on_or_trusts_a_hostile_conf_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, make: Callable[[Path], object], why: str
) -> None:
    """A job's user points NCCL_CONF_FILE at /dev/zero, a FIFO or another user's file: the probe's settings line
    neither fills memory nor waits, sets nothing from it, and says why it was not read."""
    hostile = tmp_path / "hostile.conf"
    make(hostile)
    etc = _only_these_files(monkeypatch, tmp_path, "NCCL_P2P_LEVEL=LOC\n", hostile)
    found = {s["name"]: s for s in job_settings.settings()}
    assert set(found) == {"NCCL_CONF_FILE", "NCCL_P2P_LEVEL"} and found["NCCL_P2P_LEVEL"]["source"] == str(etc)
    assert job_settings.read_conf(str(hostile)) == ("", why)


def test_a_verdict_reads_figure_then_mechanism_then_the_confirmed_setting() -> None:
    """The sentence an operator reads first: the slow all-reduce, the mechanism NCCL's log shows (one channel where
    the NVLinks carry nine), because the setting proved by measuring again without it."""
    from cluster_accept.analysis.causes import explain, intra_node_causes, node_cause
    from cluster_accept.analysis.suspects import probe_stage_causes

    def row(check: str, item: str, status: Status, reason: str, observed: str, expected: str, detail: str) -> NodeRow:
        return NodeRow("r", "c", "single-node", "n1", check, item, status, reason, observed, expected, detail)

    rows = [
        row("allreduce", "allreduce_busbw_gbps", Status.FAIL, "below_threshold", "25.0", ">= 270 GB/s", ""),
        row("nccl_mechanism", "channels_below_nvlinks", Status.WARN, "channels_below_nvlinks", "1 channels",
            ">= 9 channels (18 NVLinks per GPU)", "NCCL's log: single-node allreduce, 4 ranks on 1 node"),
        row("job_settings", "NCCL_MAX_NCHANNELS", Status.FAIL, "confirmed", "NCCL_MAX_NCHANNELS=1", "unset",
            "set in /etc/nccl.conf; measured again without it: allreduce_busbw_gbps 25.0 -> 351.9: confirmed"),
    ]  # fmt: skip
    links = probe_stage_causes(frozenset({"allreduce", "collectives", "gemm"}), "single-node")
    links += intra_node_causes(frozenset({"allreduce", "collectives"}))
    said = node_cause(rows, explain(rows, links))
    assert said == (
        "allreduce allreduce_busbw_gbps 25.0 (expected >= 270 GB/s): nccl_mechanism:channels_below_nvlinks 1 channels "
        "(NCCL's log: single-node allreduce, 4 ranks on 1 node) because job_settings:confirmed NCCL_MAX_NCHANNELS=1 "
        "(set in /etc/nccl.conf; measured again without it: allreduce_busbw_gbps 25.0 -> 351.9: confirmed)"
    )


def test_the_settings_line_is_never_a_failed_runs_last_words() -> None:
    from cluster_accept.remote.rank_end import rank_end
    from cluster_accept.vocabulary.text import run_output

    stderr = f"{LINE}\nTraceback (most recent call last):\nRuntimeError: NCCL error: unhandled system error"
    end = rank_end(1, run_output("", stderr))
    assert "RuntimeError: NCCL error" in end.lines and '"settings"' not in end.lines
    assert run_output("out", LINE) == "out\n"


def test_the_node_side_script_masks_by_the_projects_own_rule() -> None:
    """job_settings.py ships alone: its copy of the rule for a secret name is the project's."""
    from cluster_accept.vocabulary import secrets

    assert job_settings.SECRET_NAME_ERE == secrets.SECRET_NAME_ERE
    assert job_settings.NOT_SECRET_NAMES == {n for n in secrets.NOT_SECRET_NAMES if n.isupper()}
    for name in ("UCX_COOKIE", "NCCL_PASS", "NCCL_IB_TOKEN", "TORCH_AUTH"):
        assert job_settings._value(name, "s3cr3t") == "****", name
    assert job_settings._value("NCCL_IB_PKEY", "0x8001") == "0x8001"
