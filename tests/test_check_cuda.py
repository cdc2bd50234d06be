"""checks/cuda.py on the real captures of both machines and on faulty variants derived from them."""

from __future__ import annotations

import pytest

import cluster_accept.checks.cuda as cuda
from cluster_accept.checks.base import majority_values
from cluster_accept.inventory.model import Profile
from tests.capture import DRIVER_FAILURE, NO_CLUSTER, captured, table

CUDA_13 = Profile(cuda_version="13.0")
LIB = "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3"


def captured_nccl_env(machine: str) -> str:
    env, code = captured(machine, "env-nccl.txt")
    assert code == 0
    (value,) = [line.split("=", 1)[1] for line in env.splitlines() if line.startswith("NCCL_VERSION=")]
    return value


def node_output(smi: str, rc: int = 0, env: str = "", libs: tuple[str, ...] = ()) -> str:
    """What COMMAND prints: ``$(nvidia-smi)`` (trailing newlines stripped) re-printed through ``head -n 12``,
    the marker with nvidia-smi's exit status, ``env=`` and one ``lib=`` per resolved libnccl."""
    head = "".join(line + "\n" for line in smi.rstrip("\n").split("\n")[:12])
    return head + f"### nccl nvidia-smi rc={rc}\nenv={env}\n" + "".join(f"lib={lib}\n" for lib in libs)


def capture_output(machine: str, libs: tuple[str, ...] = ()) -> str:
    smi, code = captured(machine, "nvidia-smi.txt")
    return node_output(smi, code, captured_nccl_env(machine), libs)


def test_command() -> None:
    assert cuda.COMMAND == (
        "out=$(nvidia-smi 2>&1); rc=$?; printf '%s\\n' \"$out\" | head -n 12; "
        "printf '%s\\n' \"### nccl nvidia-smi rc=$rc\"; printf 'env=%s\\n' \"${NCCL_VERSION:-}\"; "
        "{ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | awk '/libnccl\\.so\\.[0-9]/ {print $NF}' | "
        'while read -r lib; do printf \'lib=%s\\n\' "$(readlink -f "$lib")"; done | head -n 8'
    )


@pytest.mark.parametrize("machine", ["h200x4", "h100x1"])
def test_captures_with_nccl_from_the_environment(machine: str) -> None:
    assert captured_nccl_env(machine) == "2.28.3-1"
    model = cuda.parse(capture_output(machine), 0)
    assert (model.cuda_version, model.nccl_env, model.nccl_libs, model.nccl_version) == (
        "13.0",
        "2.28.3-1",
        [],
        "2.28.3",
    )
    rows = cuda.evaluate(model, CUDA_13, NO_CLUSTER)
    assert table(rows) == [
        ("cuda_version", None, "pass", "ok", "13.0", "13.0"),
        ("nccl_version", None, "pass", "recorded", "2.28.3", None),
    ]
    assert rows[1].detail == "NCCL_VERSION=2.28.3-1"
    assert cuda.cluster_values(model) == {"cuda_version": "13.0", "nccl_version": "2.28.3"}


def test_library_from_ldconfig_wins_over_the_environment() -> None:
    other = "/opt/nccl/lib/libnccl.so.2.21.5"
    model = cuda.parse(capture_output("h100x1", (other, LIB, other)), 0)
    assert model.nccl_libs == [(other, "2.21.5"), (LIB, "2.28.3")]
    rows = cuda.evaluate(model, Profile(), NO_CLUSTER)
    assert table(rows) == [
        ("cuda_version", None, "pass", "recorded", "13.0", None),
        ("nccl_version", None, "pass", "recorded", "2.21.5", None),
    ]
    assert rows[1].detail == f"ldconfig: {other}; ldconfig: {LIB}; NCCL_VERSION=2.28.3-1"


def test_library_only_and_unresolved_soname_ignored() -> None:
    smi, _ = captured("h200x4", "nvidia-smi.txt")
    model = cuda.parse(node_output(smi, libs=("/usr/lib/x86_64-linux-gnu/libnccl.so.2", LIB)), 0)
    assert (model.nccl_version, model.nccl_libs) == ("2.28.3", [(LIB, "2.28.3")])


def test_another_cuda_version_fails() -> None:
    smi, _ = captured("h200x4", "nvidia-smi.txt")
    changed = smi.replace("CUDA Version: 13.0", "CUDA Version: 12.8")
    assert changed != smi
    model = cuda.parse(node_output(changed, env="2.28.3-1"), 0)
    assert table(cuda.evaluate(model, CUDA_13, NO_CLUSTER)) == [
        ("cuda_version", None, "fail", "cuda_mismatch", "12.8", "13.0"),
        ("nccl_version", None, "pass", "recorded", "2.28.3", None),
    ]


def test_cuda_and_nccl_drift_against_the_majority() -> None:
    smi, _ = captured("h200x4", "nvidia-smi.txt")
    old = cuda.parse(node_output(smi.replace("CUDA Version: 13.0", "CUDA Version: 12.8"), env="2.21.5-1"), 0)
    new = cuda.parse(capture_output("h200x4"), 0)
    view = majority_values(
        {"a": cuda.cluster_values(old), "b": cuda.cluster_values(old), "c": cuda.cluster_values(new)}
    )
    assert dict(view.majority) == {"cuda_version": "12.8", "nccl_version": "2.21.5"}
    assert table(cuda.evaluate(new, CUDA_13, view)) == [
        ("cuda_version", None, "pass", "ok", "13.0", "13.0"),
        ("cuda_drift", None, "warn", "drift", "13.0", "12.8 (majority)"),
        ("nccl_version", None, "pass", "recorded", "2.28.3", None),
        ("nccl_drift", None, "warn", "drift", "2.28.3", "2.21.5 (majority)"),
    ]
    assert table(cuda.evaluate(new, Profile(), view))[1] == (
        "cuda_drift",
        None,
        "fail",
        "drift",
        "13.0",
        "12.8 (majority)",
    )
    assert table(cuda.evaluate(old, Profile(), view)) == [
        ("cuda_version", None, "pass", "recorded", "12.8", None),
        ("nccl_version", None, "pass", "recorded", "2.21.5", None),
    ]


def test_nccl_unreadable_is_skipped() -> None:
    smi, _ = captured("h100x1", "nvidia-smi.txt")
    for env in ("", "unknown"):
        model = cuda.parse(node_output(smi, env=env), 0)
        rows = cuda.evaluate(model, CUDA_13, NO_CLUSTER)
        assert table(rows)[1] == ("nccl_version", None, "skip", "nccl_version_unreadable", None, None)
        assert cuda.cluster_values(model) == {"cuda_version": "13.0"}


def test_cuda_version_not_available() -> None:
    smi, _ = captured("h100x1", "nvidia-smi.txt")
    model = cuda.parse(node_output(smi.replace("CUDA Version: 13.0", "CUDA Version: N/A "), env="2.28.3-1"), 0)
    assert table(cuda.evaluate(model, CUDA_13, NO_CLUSTER))[0] == (
        "cuda_version",
        None,
        "fail",
        "cuda_mismatch",
        "N/A",
        "13.0",
    )
    assert table(cuda.evaluate(model, Profile(), NO_CLUSTER))[0] == (
        "cuda_version",
        None,
        "skip",
        "cuda_version_unreadable",
        "N/A",
        None,
    )
    assert cuda.cluster_values(model) == {"nccl_version": "2.28.3"}


@pytest.mark.parametrize(
    "stdout, code",
    [
        (node_output(DRIVER_FAILURE, rc=9, env="2.28.3-1"), 0),  # what COMMAND prints
        (DRIVER_FAILURE, 9),  # nvidia-smi's own output
    ],
)
def test_driver_failure_is_one_skip_row(stdout: str, code: int) -> None:
    model = cuda.parse(stdout, code)
    assert table(cuda.evaluate(model, CUDA_13, NO_CLUSTER)) == [
        ("nvidia-smi", None, "skip", "nvidia_smi_failed", DRIVER_FAILURE.strip(), None)
    ]
    assert cuda.cluster_values(model) == ({"nccl_version": "2.28.3"} if code == 0 else {})


def test_nvidia_smi_missing_is_a_driver_failure() -> None:
    model = cuda.parse(node_output("sh: 1: nvidia-smi: not found", rc=127), 0)
    assert table(cuda.evaluate(model, CUDA_13, NO_CLUSTER)) == [
        ("nvidia-smi", None, "skip", "nvidia_smi_failed", "nvidia-smi not found on the node", None)
    ]


def _cut_mid_line(text: str) -> str:
    cut = len(text) // 2
    return text[: cut - 1 if text[cut - 1] == "\n" else cut]


@pytest.mark.parametrize(
    "stdout",
    [
        _cut_mid_line(capture_output("h200x4")),  # cut inside the nvidia-smi table, before the nccl section
        capture_output("h200x4", (LIB,))[:-5],  # cut inside 'lib=...libnccl.so.2.28.3'
        capture_output("h200x4").split("env=")[0],  # the nccl section has no env= line
        "\x00\x7f#!garbage ~~~ 42\n",
        node_output("\x00\x7f#!garbage ~~~ 42", env="2.28.3-1"),  # no 'CUDA Version:' before the marker
        "",
        "x" * 200_000 + "\n",
    ],
)
def test_truncated_and_garbage_output_is_an_error_row_with_the_raw_text(stdout: str) -> None:
    model = cuda.parse(stdout, 0)
    rows = cuda.evaluate(model, CUDA_13, NO_CLUSTER)
    assert [(r.item, r.status.value, r.reason) for r in rows] == [("output", "error", "unparsable_output")]
    assert stdout[:40] in rows[0].detail
    assert cuda.cluster_values(model) == {}
