"""Property-based fuzzing of every check's ``parse``/``evaluate``/``cluster_values`` (the probe-output parsers:
test_fuzz_probe_outputs.py, with the mutations here), seeded with the real captures in testbed/captures and
mutated the way broken nodes break them (cut mid-line, lines lost or repeated, numbers garbled, stray unicode,
CRLF, NUL bytes), plus plain random text.

The properties: ``parse`` never raises and returns its model; garbage never yields a ``pass`` row, and the
error shows in the rows; ``evaluate`` and ``cluster_values`` never raise on any model ``parse`` returns; every
reason a row carries is declared, with the status declared for it (tests/test_check_reasons.py).
``derandomize=True`` keeps every run on the same examples, so CI cannot flake.
"""

from __future__ import annotations

import functools
import re
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_accept.checks.base import Check, CheckRow, ClusterView, Status, discover, majority_values
from cluster_accept.inventory.load import load_inventory
from cluster_accept.inventory.model import (
    ExpectedTransport,
    MinVersion,
    NvlinkSpec,
    PcieSpec,
    ProbeSettings,
    Profile,
)
from cluster_accept.testbed.profile import base_profile
from tests.capture import DRIVER_FAILURE, NO_CLUSTER, captured, every_field_block, noheader
from tests.test_check_reasons import assert_declared

DATA = Path(__file__).resolve().parent / "data"

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MACHINES = ("h200x4", "h100x1")
CHECKS = {check.name: check for check in discover()}
EXIT_CODES = st.one_of(st.none(), st.integers(-300, 300))

# Real profiles: the contract's, the test-bed's (derived from the captures), none at all, and one that pins
# the other way (minimum driver, no NVLink, persistence off, InfiniBand expected).
PROFILES = [
    Profile(),
    load_inventory(
        Path(__file__).resolve().parent.parent / "cluster_accept" / "inventory" / "examples" / "contract.yaml",
        check_files=False,
    ).profiles["h200-sxm"],
    *(Profile.model_validate(base_profile(machine)) for machine in MACHINES),
    Profile(
        driver_version=MinVersion(min="570.0"),
        persistence_mode="disabled",
        nvlink=NvlinkSpec(links_per_gpu=0, link_speed_gbps=1.0),
        pcie=PcieSpec(gen=4, width=8),
        nccl_env={"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5", "NCCL_API_TOKEN": "x"},
        probes=ProbeSettings(expected_transport=ExpectedTransport(intra_node="P2P", inter_node="NET/IB/0")),
    ),
]


# Seeds: what each check's COMMAND prints on the captured machines --------------------------------------


def _capture(machine: str, name: str) -> str:
    stdout, _ = captured(machine, name)
    return stdout


def _driver(machine: str) -> str:
    versions = noheader(machine, ["driver_version"])
    return f"{versions}### /proc/driver/nvidia/version rc=0\n{_capture(machine, 'proc-driver-version.txt')}"


def _cuda(machine: str) -> str:
    smi, rc = captured(machine, "nvidia-smi.txt")
    env = dict(line.split("=", 1) for line in _capture(machine, "env-nccl.txt").splitlines())
    head = "".join(line + "\n" for line in smi.rstrip("\n").split("\n")[:12])
    lib = "lib=/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3\n"
    return f"{head}### nccl nvidia-smi rc={rc}\nenv={env.get('NCCL_VERSION', '')}\n{lib}"


def _nccl_env(machine: str) -> str:
    env = "".join(line + "\n" for line in sorted(_capture(machine, "env-nccl.txt").splitlines()))
    etc = "NCCL_DEBUG=WARN\n# comment\nNCCL_SOCKET_IFNAME = eth1\nNCCL_IB_HCA=mlx5_0\n"
    return f"### env\n{env}### /etc/nccl.conf\n{etc}### NCCL_CONF_FILE\nNCCL_NET_GDR_LEVEL=PHB\n### end\n"


def _nccl_harmful(machine: str) -> str:
    """The environment sections, then the node's facts: interfaces, HCA ports, GPUs and active NVLinks."""
    gpus = _capture(machine, "nvidia-smi-L.txt").count("GPU ")
    links = _capture(machine, "nvlink-s.txt").count("GB/s")
    facts = f"### net\neth0 up\nlo unknown\n### hca\nmlx5_0 1 4: ACTIVE\n### gpus\n{gpus}\n### nvlink\n{links}\n"
    return _nccl_env(machine) + facts + "### facts end\n"


def _gpu_processes(machine: str) -> str:
    """The GPUs' UUIDs from the capture, and one process on the first GPU in --query-compute-apps' format."""
    lines = _capture(machine, "nvidia-smi-L.txt").splitlines()
    uuids = [line.split("UUID: ")[1].rstrip(")") for line in lines if "UUID: " in line]
    gpus = "".join(f"{i}, {u}\n" for i, u in enumerate(uuids))
    return f"### gpus\n{gpus}### apps\n{uuids[0]}, 48211, python3, 20480\n### end\n"


def _nvlink(machine: str) -> str:
    status, rc = captured(machine, "nvlink-s.txt")
    return f"{status}### nvidia-smi nvlink -s rc={rc}\n{_capture(machine, 'nvlink-e.txt')}"


def _infiniband() -> str:
    ports = [
        "/sys/class/infiniband/mlx5_0/ports/1 4: ACTIVE 400 Gb/sec (4X NDR) InfiniBand",
        "/sys/class/infiniband/mlx5_1/ports/1 1: DOWN 200 Gb/sec (4X HDR) InfiniBand",
        "/sys/class/infiniband/mlx5_2/ports/1 4: ACTIVE 100 Gb/sec (2X HDR) Ethernet",
        "/sys/class/infiniband/mlx5_3/ports/1   ",
    ]
    return "### ports\n" + "".join(p + "\n" for p in ports) + "### peermem loaded\n### end\n"


def _xid() -> str:
    dmesg = (
        "[    0.000000] Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103)\n"
        "[ 1234.567890] NVRM: Xid (PCI:0000:18:00): 48, pid=2231, name=python3, An uncorrectable double bit error\n"
        "[ 1295.817890] NVRM: Xid (PCI:0000:2a:00): 43, pid=0, name=swapper/0, Ch 00000008\n"
        "[ 1357.067890] NVRM: Xid (PCI:0000:2a:00): garbled\n"
    )
    denied = "dmesg: read kernel buffer failed: Operation not permitted\n"
    return (
        f"### source=dmesg\n{denied}### rc=1\n### lines=1 xid=0\n"
        f"### source=journalctl\n{dmesg}### rc=0\n### lines=4 xid=3\n### done\n"
    )


def _nvswitch(machine: str) -> str:
    """What the nvswitch COMMAND prints on the machine: its GPUs' Fabric sections (from nvidia-smi -q), no switch,
    no Fabric Manager (the h200x1 VM's answer: ``nv-fabricmanager: not found``)."""
    fabric, inside = [], False
    for line in _capture(machine, "nvidia-smi-q.txt").splitlines():
        if line.startswith("GPU 0"):
            fabric.append(line)
        inside = line == "    Fabric" or (inside and line.startswith("        "))
        if inside and line.strip().startswith(("State ", "Status ")):
            fabric.append(line)
    return (
        "### switches\n### service\nLoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success\nrc=0\n"
        "### process\nnone\n### fm_version\nsh: 1: nv-fabricmanager: not found\nrc=127\n### driver\n"
        + _capture(machine, "proc-driver-version.txt")
        + "### fabric\n"
        + "\n".join(fabric)
        + "\n### end\n"
    )


def _firmware() -> str:
    """The firmware COMMAND's output: the 4 x H200 capture's VBIOS and InfoROM, two HCAs as sysfs reads them."""
    vbios, inforom = every_field_block("vbios_version")[1:], every_field_block("inforom.img")[1:]
    bus = every_field_block("pci.bus_id")[1:]
    smi = "".join(f"{i}, {b}, {v}, {r}\n" for i, (b, v, r) in enumerate(zip(bus, vbios, inforom, strict=True)))
    hcas = "mlx5_0|28.39.1002|MT4129|MT_0000000838\nmlx5_1|28.39.1002|MT4129|MT_0000000838\n"
    return f"{smi}### rc=0\n### hca\n{hcas}### ofed\nMLNX_OFED_LINUX-24.10-1.1.4.0\n### end\n"


def _pcie_aer() -> str:
    """The AER COMMAND's output over a sysfs tree in the kernel's formats: a GPU (the h200x1 VM's link) with its
    three AER files, and an HCA."""
    lines = ["D|0000:00:06.0|0x030200|16|16|32.0 GT/s PCIe|32.0 GT/s PCIe"]
    lines += [f"A|0000:00:06.0|correctable|{n}|{2 if n == 'BadTLP' else 0}" for n in ("RxErr", "BadTLP", "BadDLLP")]
    lines += ["A|0000:00:06.0|correctable|TOTAL_ERR_COR|2", "A|0000:00:06.0|nonfatal|CmpltTO|0",
              "A|0000:00:06.0|nonfatal|TOTAL_ERR_NONFATAL|0", "A|0000:00:06.0|fatal|TOTAL_ERR_FATAL|0",
              "D|0000:18:00.0|0x020700|16|16|32.0 GT/s PCIe|32.0 GT/s PCIe"]  # fmt: skip
    return "\n".join(lines) + "\n### end\n"


@functools.cache
def _seeds(name: str) -> list[tuple[str, int | None]]:
    """What COMMAND prints on both captured machines (InfiniBand ports and a kernel log with Xid lines in the
    format the command prints, as the machines have neither), and the dead-driver output of nvidia-smi."""
    module = CHECKS[name].module
    per_machine: dict[str, Callable[[str], str]] = {
        "driver": _driver,
        "cuda": _cuda,
        "nccl_env": _nccl_env,
        "nccl_harmful": _nccl_harmful,
        "hostname": lambda m: "name=vm\n### addresses\n127.0.0.1\n",  # what the 4 x H200 machine printed
        "gpu": _gpu_processes,
        "nvlink": _nvlink,
        "topology": lambda m: _capture(m, "topo-m.txt"),
        "gpu_count": lambda m: _capture(m, "query-gpu-noheader.txt"),
        "nvswitch": _nvswitch,
        # what the probe interpreter check printed on a node with a CPU build of torch, on a CUDA profile
        "probe": lambda m: (DATA / "probe_python" / "cpu_torch_cuda_profile.txt").read_text(),
    }
    if name in per_machine:
        seeds: list[tuple[str, int | None]] = [(per_machine[name](m), 0) for m in MACHINES]
    elif name == "infiniband":
        seeds = [(_infiniband(), 0)]
    elif name == "xid":
        seeds = [(_xid(), 0)]
    elif name == "firmware":
        seeds = [(_firmware(), 0)]
    elif name == "pcie_aer":
        seeds = [(_pcie_aer(), 0)]
    elif name == "ib_counters":  # the check's own command over a sysfs tree shaped as the ABI documents it
        seeds = [((DATA / "ib_counters" / "two_ports.txt").read_text(), 0)]
    elif name == "roce":  # likewise: a ConnectX port's GID table, NCCL_IB_GID_INDEX=3
        seeds = [((DATA / "roce" / "gid_index_3.txt").read_text(), 0)]
    elif name == "roce_qos":  # likewise: two ConnectX RoCE ports, PFC as mlnx_qos prints it, their counters
        seeds = [((DATA / "roce_qos" / "two_ports.txt").read_text(), 0)]
    elif name == "efa":  # likewise: a p5's 32 EFA devices, the plugin and the efa provider found
        seeds = [((DATA / "efa" / "p5_healthy.txt").read_text(), 0)]
    else:  # the --query-gpu checks
        seeds = [(noheader(m, module.FIELDS), 0) for m in MACHINES]
    if name not in (
        "infiniband",
        "ib_counters",
        "roce",
        "roce_qos",
        "efa",
        "nccl_env",
        "nccl_harmful",
        "hostname",
        "xid",
        "probe",
        "nvswitch",
        "firmware",
        "pcie_aer",
    ):
        seeds.append((DRIVER_FAILURE, 9))
    return seeds


def test_every_check_has_seeds_that_parse_cleanly() -> None:
    """The seeds are real: each healthy capture parses without error (so mutations start from the real shape)."""
    assert len(CHECKS) >= 12
    for name in CHECKS:
        for stdout, code in _seeds(name):
            if code == 0:
                model = CHECKS[name].parse(stdout, code)
                assert model.error is None, (name, model.error)


# Mutations ---------------------------------------------------------------------------------------------

Draw = Callable[[st.SearchStrategy[typing.Any]], typing.Any]
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# Numbers as a broken tool or a corrupted stream may print them. Python's int() refuses '²' (though
# '²'.isdigit()) and anything over 4300 digits: those come twice as often.
_INT_REFUSES = ["9" * 5000, "1" * 4301, "²", "³"]
_ODD_NUMBERS = ["٣", "𝟗", "1.2.3", ".", "", "-1", "nan", "1e999", "0x1F", "2" * 30]
HOSTILE_NUMBERS = st.sampled_from(_INT_REFUSES * 2 + _ODD_NUMBERS)
ODD_BREAKS = st.sampled_from(["\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1e", "\x85", "\u2028", "\n\n", ""])


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _truncate(draw: Draw, text: str) -> str:
    return text[: draw(st.integers(0, len(text)))]


def _delete_line(draw: Draw, text: str) -> str:
    lines = _lines(text)
    if lines:
        del lines[draw(st.integers(0, len(lines) - 1))]
    return "".join(lines)


def _duplicate_line(draw: Draw, text: str) -> str:
    lines = _lines(text)
    if lines:
        i = draw(st.integers(0, len(lines) - 1))
        lines.insert(draw(st.integers(0, len(lines))), lines[i])
    return "".join(lines)


def _swap_lines(draw: Draw, text: str) -> str:
    lines = _lines(text)
    if len(lines) > 1:
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
    return "".join(lines)


def _replace_line(draw: Draw, text: str) -> str:
    lines = _lines(text)
    if lines:
        lines[draw(st.integers(0, len(lines) - 1))] = draw(st.text(max_size=40)) + "\n"
    return "".join(lines)


def _replace_number(draw: Draw, text: str) -> str:
    numbers = list(_NUMBER.finditer(text))
    if not numbers:
        return text
    found = numbers[draw(st.integers(0, len(numbers) - 1))]
    new = draw(st.one_of(HOSTILE_NUMBERS, HOSTILE_NUMBERS, st.integers().map(str), st.text(max_size=6)))
    return text[: found.start()] + new + text[found.end() :]


def _replace_every_number(draw: Draw, text: str) -> str:
    return _NUMBER.sub(draw(HOSTILE_NUMBERS), text)


def _replace_column(draw: Draw, text: str) -> str:
    """One column of a table garbled on every line: the k-th number of each line becomes the same hostile text."""
    column, new = draw(st.integers(0, 12)), draw(HOSTILE_NUMBERS)

    def garble(line: str) -> str:
        numbers = list(_NUMBER.finditer(line))
        if column >= len(numbers):
            return line
        found = numbers[column]
        return line[: found.start()] + new + line[found.end() :]

    return "".join(garble(line) for line in _lines(text))


def _insert_text(draw: Draw, text: str) -> str:
    at = draw(st.integers(0, len(text)))
    return text[:at] + draw(st.text(min_size=1, max_size=20)) + text[at:]


def _insert_nul(draw: Draw, text: str) -> str:
    at = draw(st.integers(0, len(text)))
    return text[:at] + "\x00" * draw(st.integers(1, 3)) + text[at:]


def _crlf(draw: Draw, text: str) -> str:
    return text.replace("\n", "\r\n")


def _odd_line_break(draw: Draw, text: str) -> str:
    breaks = [m.start() for m in re.finditer("\n", text)]
    if not breaks:
        return text
    at = breaks[draw(st.integers(0, len(breaks) - 1))]
    return text[:at] + draw(ODD_BREAKS) + text[at + 1 :]


MUTATIONS: list[Callable[[Draw, str], str]] = [
    _truncate,
    _delete_line,
    _duplicate_line,
    _swap_lines,
    _replace_line,
    _replace_number,
    _replace_number,
    _replace_number,
    _replace_every_number,
    _replace_column,
    _insert_text,
    _insert_nul,
    _crlf,
    _odd_line_break,
]


@st.composite
def mutated(draw: Draw, seeds: list[tuple[str, int | None]]) -> tuple[str, int | None]:
    """A seed output with one to three mutations, and its exit code or another one."""
    text, code = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 3))):
        text = draw(st.sampled_from(MUTATIONS))(draw, text)
    return text, draw(st.one_of(st.just(code), EXIT_CODES))


def outputs(seeds: list[tuple[str, int | None]]) -> st.SearchStrategy[tuple[str, int | None]]:
    """Mostly mutated seeds; also random text, and the seeds as they are."""
    changed = mutated(seeds)
    return st.one_of(changed, changed, changed, st.tuples(st.text(), EXIT_CODES), st.sampled_from(seeds))


def text_outputs(seeds: list[str]) -> st.SearchStrategy[str]:
    texts = mutated([(s, 0) for s in seeds]).map(lambda pair: pair[0])
    return st.one_of(texts, texts, texts, st.text(), st.sampled_from(seeds))


# Checks ------------------------------------------------------------------------------------------------


@functools.cache
def _views(check: Check) -> st.SearchStrategy[ClusterView]:
    """No cluster, the majority of the healthy seeds, and majorities with random values for the same keys."""
    values = [check.cluster_values(check.parse(s, c)) for s, c in _seeds(check.name)] if check.cluster_values else []
    healthy = majority_values({f"node{i}": v for i, v in enumerate(values)})
    keys = sorted({k for v in values for k in v} | {"nccl_keys", "gpu_count", "driver_version"})
    random = st.dictionaries(st.sampled_from(keys), st.text(max_size=12)).map(
        lambda majority: ClusterView(majority=majority, nodes_compared=3)
    )
    return st.one_of(st.just(NO_CLUSTER), st.just(healthy), random)


def _assert_rows(check: Check, model: typing.Any, rows: list[CheckRow]) -> None:
    assert isinstance(rows, list)
    for row in rows:
        assert isinstance(row, CheckRow)
        assert row.check == check.name
        assert isinstance(row.status, Status)
        assert re.fullmatch(r"[a-z0-9_]+", row.reason), row.reason  # a stable code, not free text
        assert isinstance(row.item, str) and row.item
        assert isinstance(row.detail, str)
        assert row.observed is None or isinstance(row.observed, str)
        assert row.expected is None or isinstance(row.expected, str)
        assert row.gpu is None or isinstance(row.gpu, int)
        assert_declared(row)
    if model.error or getattr(model, "failure", None):
        assert all(row.status != Status.PASS for row in rows), "unreadable output passed"
    if model.error:
        said = [r for r in rows if r.status in (Status.ERROR, Status.SKIP) and model.error[:60] in r.detail]
        assert said, f"the error {model.error!r} shows in no row"


@pytest.mark.parametrize("name", sorted(CHECKS))
@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_check_parse_evaluate_and_cluster_values_never_raise(name: str, data: st.DataObject) -> None:
    check = CHECKS[name]
    stdout, exit_code = data.draw(outputs(_seeds(name)), label="output")
    model = check.parse(stdout, exit_code)
    assert isinstance(model, typing.get_type_hints(check.parse)["return"])
    assert model.error is None or (isinstance(model.error, str) and model.error.strip())
    assert isinstance(model.raw, str)
    if name not in ("nccl_env", "nccl_harmful"):  # both keep their raw text with secrets masked
        assert model.raw == stdout
    values = check.cluster_values(model) if check.cluster_values else {}
    assert isinstance(values, dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in values.items())
    if model.error:
        assert values == {}, "an unreadable output must not vote in the cluster majority"
    counters = getattr(check.module, "counters", None)  # error counters compared with the node's last run
    if counters is not None:
        found = counters(model)
        assert all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in found.items())
        assert not (model.error and found)
    view = data.draw(_views(check), label="cluster")
    for profile in PROFILES:
        _assert_rows(check, model, check.evaluate(model, profile, view))


def _drifted(view: ClusterView) -> ClusterView:
    """The majority with every value changed: each compared value of a healthy node drifts."""
    return ClusterView({key: f"other-{value}" for key, value in view.majority.items()}, view.nodes_compared)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_reasons_on_the_real_captures_are_declared(name: str) -> None:
    """Every row of every seed (the real captures, the dead driver) under every profile, alone, in a healthy
    cluster and in one whose majority differs in every value, carries a declared reason and its severity."""
    check = CHECKS[name]
    values = [check.cluster_values(check.parse(s, c)) for s, c in _seeds(name)] if check.cluster_values else []
    healthy = majority_values({f"node{i}": v for i, v in enumerate(values)})
    reasons = set()
    for stdout, code in _seeds(name):
        model = check.parse(stdout, code)
        for profile in PROFILES:
            for view in (NO_CLUSTER, healthy, _drifted(healthy)):
                rows = check.evaluate(model, profile, view)
                _assert_rows(check, model, rows)
                reasons |= {row.reason for row in rows}
    assert reasons, name
