"""NCCL's own account of a run, read from real 4 x H200 logs (NCCL 2.28.9: torchrun, one process a GPU, and
nccl-tests, one process with a thread a GPU) and faulty variants derived from them; the shapes older NCCL versions
print; where the account goes (nccl.parquet, the report) and what it says about a node against the cluster."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pyarrow.parquet as pq
import pytest

from cluster_accept.analysis.nccl_account import NcclRun, facts_of, read_account
from cluster_accept.analysis.nccl_mechanism import NCCL_CHOICE, ClusterAccount, NcclMechanism, mechanism
from cluster_accept.analysis.schemas import NCCL, write_table
from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.flows.acceptance import write_tables
from cluster_accept.inventory.model import DEFAULT_SSH, LOCAL_ADDRESS, Inventory, Node, Profile
from cluster_accept.remote.launch import GroupRun, RankRun
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.reports.nccl import account_lines
from cluster_accept.reports.render import ReportData, build_context, render
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.tasks.multi_node.ranks import ALLREDUCE_JOB
from cluster_accept.tasks.multi_node.stage import STAGE as MULTI_NODE
from cluster_accept.tasks.multi_node.stage import SavedOutcome, _Stage
from cluster_accept.tasks.probe_runs import judge_nodes
from cluster_accept.tasks.single_node import STAGE as SINGLE_NODE
from cluster_accept.tasks.stage import RunTables
from cluster_accept.vocabulary.rows import NcclFact
from tests.boundary import entered
from tests.capture import CAPTURES, captured

PLUGINS = {"env": "none", "net": "none", "network": "Socket", "profiler": "none", "tuner": "none"}
HEALTHY_CHANNELS = "24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer"


def _run(node: str = "node01", probe: str = "allreduce", stage: str = "single-node") -> NcclRun:
    return NcclRun("r1", "c", stage, node, probe)


def _by_rank(facts: list[NcclFact], kind: str) -> dict[int | None, dict[str, str]]:
    found: dict[int | None, dict[str, str]] = {}
    for fact in facts:
        if fact.kind == kind:
            found.setdefault(fact.rank, {})[fact.name] = fact.value
    return found


@pytest.mark.parametrize(
    ("capture", "channels", "settings", "shape", "count"),
    [
        ("nccl-allreduce-p2p-cumem.txt", (24, 24, 0, 32, 32), {"NCCL_NVLS_ENABLE": "0"}, (4, 1, 4), 60),
        (
            "nccl-allreduce-p2p-ipc.txt",
            (24, 24, 0, 32, 32),
            {"NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0"},
            (4, 1, 4),
            64,
        ),
        ("nccl-allreduce-shm.txt", (4, 4, 0, 4, 2), {"NCCL_NVLS_ENABLE": "0", "NCCL_P2P_DISABLE": "1"}, (4, 1, 4), 64),
        (
            "nccl-allreduce-socket.txt",  # P2P and SHM off: NCCL sees each GPU as a node of its own
            (2, 2, 0, 2, 2),
            {"NCCL_NVLS_ENABLE": "0", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
            (4, 4, 1),
            68,
        ),
        (
            "nccl-allreduce-p2p-level-loc.txt",
            (4, 4, 0, 4, 2),
            {"NCCL_NVLS_ENABLE": "0", "NCCL_P2P_LEVEL": "LOC"},
            (4, 1, 4),
            64,
        ),
    ],
)
def test_every_rank_of_every_captured_log_has_its_account(
    capture: str, channels: tuple[int, ...], settings: dict[str, str], shape: tuple[int, int, int], count: int
) -> None:
    text, code = captured("h200x4", capture)
    assert code == 0
    facts = read_account(text, _run())
    assert len(facts) == count
    names = ("coll", "collnet", "nvls", "p2p", "p2p_per_peer")
    assert _by_rank(facts, "channels") == {r: dict(zip(names, map(str, channels), strict=True)) for r in range(4)}
    nranks, nnodes, local = shape
    sizes = {"nranks": str(nranks), "nnodes": str(nnodes), "local_ranks": str(local)}
    assert _by_rank(facts, "communicator") == {r: sizes for r in range(4)}
    assert _by_rank(facts, "setting") == {r: settings for r in range(4)}
    assert _by_rank(facts, "version") == {r: {"nccl": "2.28.9+cuda13.0"} for r in range(4)}
    assert _by_rank(facts, "plugin") == {r: PLUGINS for r in range(4)}
    comm_id = re.search(r"commId (0x[0-9a-f]+)", text)
    assert comm_id is not None
    assert {f.communicator for f in facts if f.kind in ("channels", "communicator")} == {comm_id.group(1)}
    assert {f.communicator for f in facts if f.kind in ("setting", "version", "plugin")} == {None}
    assert {(f.run_id, f.stage, f.node, f.probe, f.group) for f in facts} == {
        ("r1", "single-node", "node01", "allreduce", None)
    }


def test_the_threads_of_one_nccl_tests_process_are_its_ranks() -> None:
    """nccl-tests ``-g 4``: one process, a thread per GPU; each thread's ``[cudaDev]`` names its rank's lines."""
    text = (CAPTURES / "h200x4" / "nccl-tests-allreduce-nvlink.txt").read_text()
    facts = read_account(text, _run())
    channels = {"coll": "24", "collnet": "24", "nvls": "0", "p2p": "32", "p2p_per_peer": "32"}
    assert _by_rank(facts, "channels") == {r: channels for r in range(4)}
    assert _by_rank(facts, "setting") == {1: {"NCCL_NVLS_ENABLE": "0"}}  # as NCCL printed it: once, by rank 1
    assert {f.communicator for f in facts if f.kind == "channels"} == {"0xdf51ee6404032090"}
    assert _by_rank(facts, "version") == {0: {"nccl": "2.28.9+cuda13.0"}}


def _fewer_channels_by_p2p_level() -> str:
    """The healthy log as NCCL_P2P_LEVEL=LOC left in /etc/nccl.conf turns it: NCCL takes the setting (and says so)
    and opens 4 channels instead of 24."""
    text, _ = captured("h200x4", "nccl-allreduce-p2p-cumem.txt")
    text = text.replace(
        HEALTHY_CHANNELS,
        "4 coll channels, 4 collnet channels, 0 nvls channels, 4 p2p channels, 2 p2p channels per peer",
    )
    return re.sub(
        r"^(\S+ \[\d\] NCCL INFO )NCCL_NVLS_ENABLE set by environment to 0\.$",
        r"\g<0>\n\1NCCL_P2P_LEVEL set by environment to LOC",
        text,
        flags=re.MULTILINE,
    )


def _cluster(faulty: str, healthy: int = 3) -> list[NcclFact]:
    good, _ = captured("h200x4", "nccl-allreduce-p2p-cumem.txt")
    facts = []
    for i in range(1, healthy + 1):
        facts += read_account(good, _run(f"node{i:02d}"))
    return facts + read_account(faulty, _run(f"node{healthy + 1:02d}"))


def test_a_setting_that_costs_channels_is_read_per_rank_and_folded_per_node() -> None:
    facts = _cluster(_fewer_channels_by_p2p_level())
    faulty = [f for f in facts if f.node == "node04"]
    assert _by_rank(faulty, "setting") == {r: {"NCCL_NVLS_ENABLE": "0", "NCCL_P2P_LEVEL": "LOC"} for r in range(4)}
    assert {r: c["coll"] for r, c in _by_rank(faulty, "channels").items()} == {r: "4" for r in range(4)}
    assert account_lines(facts) == [
        (
            "channels (single-node allreduce, 4 ranks on 1 node)",
            "24 channels (32 p2p) on node[01-03]; 4 channels (4 p2p) on node04",
        ),
        (
            "settings NCCL took (single-node allreduce)",
            "NCCL_NVLS_ENABLE=0 on node[01-03]; NCCL_NVLS_ENABLE=0, NCCL_P2P_LEVEL=LOC on node04",
        ),
        ("version (single-node allreduce)", "2.28.9+cuda13.0 on node[01-04]"),
        (
            "plug-ins (single-node allreduce)",
            "env none, net none, network Socket, profiler none, tuner none on node[01-04]",
        ),
    ]


def test_fewer_channels_than_the_healthy_majority_or_the_nvlinks_allow_is_the_mechanism() -> None:
    facts = _cluster(_fewer_channels_by_p2p_level())
    shape = "single-node allreduce, 4 ranks on 1 node"
    assert mechanism("node04", facts, nvlinks_per_gpu=18) == [
        NcclMechanism("node04", "channels_below_majority", shape, "4 channels", "24 channels, as on node[01-03]"),
        NcclMechanism("node04", "channels_below_nvlinks", shape, "4 channels", ">= 9 channels (18 NVLinks per GPU)"),
    ]
    assert mechanism("node01", facts, nvlinks_per_gpu=18) == []
    account = ClusterAccount.of(facts)  # built once for many nodes: the same findings
    assert mechanism("node04", account, nvlinks_per_gpu=18) == mechanism("node04", facts, nvlinks_per_gpu=18)
    # One node alone has no majority to fall below; its NVLinks still say what it should have opened.
    alone = [f for f in facts if f.node == "node04"]
    assert [m.what for m in mechanism("node04", alone, nvlinks_per_gpu=18)] == ["channels_below_nvlinks"]
    assert mechanism("node04", alone) == []


def test_the_healthy_nodes_named_make_the_majority() -> None:
    good, _ = captured("h200x4", "nccl-allreduce-p2p-cumem.txt")
    slow = _fewer_channels_by_p2p_level()
    facts = [
        *read_account(good, _run("node01")),
        *read_account(good, _run("node02")),
        *read_account(slow, _run("node03")),
        *read_account(slow, _run("node04")),
    ]
    assert mechanism("node04", facts) == []  # two against two: no majority
    found = mechanism("node04", facts, healthy={"node01", "node02"})
    assert [(m.what, m.observed, m.expected) for m in found] == [
        ("channels_below_majority", "4 channels", "24 channels, as on node[01-02]")
    ]


def _forced(text: str, algo: str, proto: str, tuning: str) -> str:
    """``text`` with NCCL_ALGO and NCCL_PROTO taken from the environment, and rank 0's tuning line as NCCL prints
    it with NCCL_DEBUG_SUBSYS=TUNING."""
    text = re.sub(
        r"^(\S+ \[\d\] NCCL INFO )NCCL_NVLS_ENABLE set by environment to 0\.$",
        rf"\g<0>\n\1NCCL_ALGO set by environment to {algo}\n\1NCCL_PROTO set by environment to {proto}",
        text,
        flags=re.MULTILINE,
    )
    return text.replace("COLL all_reduce bytes=1073741824", f"vm:4544:4544 [0] NCCL INFO {tuning}\nCOLL all_reduce", 1)


def test_another_algorithm_or_protocol_than_the_majority_is_the_mechanism() -> None:
    good, _ = captured("h200x4", "nccl-allreduce-p2p-cumem.txt")
    ring = "AllReduce: 1073741824 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..23}"
    healthy = good.replace("COLL all_reduce bytes=1073741824", f"vm:4544:4544 [0] NCCL INFO {ring}\nCOLL x", 1)
    tree = "AllReduce: 1073741824 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..3}"
    facts = _cluster(_forced(good, "Tree", "LL", tree))
    facts = [f for f in facts if f.node == "node04"] + [
        f for i in (1, 2, 3) for f in read_account(healthy, _run(f"node{i:02d}"))
    ]
    node04 = [f for f in facts if f.node == "node04"]
    # every rank took the variables; rank 0 alone logs what each call ran with
    assert _by_rank(node04, "algorithm") == {0: {"NCCL_ALGO": "Tree", "AllReduce 1073741824": "TREE"}} | {
        r: {"NCCL_ALGO": "Tree"} for r in (1, 2, 3)
    }
    assert _by_rank(node04, "protocol") == {0: {"NCCL_PROTO": "LL", "AllReduce 1073741824": "LL"}} | {
        r: {"NCCL_PROTO": "LL"} for r in (1, 2, 3)
    }
    assert {r: s["NCCL_ALGO"] for r, s in _by_rank(node04, "setting").items()} == {r: "Tree" for r in range(4)}
    found = [(m.what, m.item, m.observed, m.expected) for m in mechanism("node04", facts)]
    assert found == [
        ("algorithm_differs", "single-node allreduce AllReduce 1073741824", "TREE", "RING, as on node[01-03]"),
        ("algorithm_differs", "single-node allreduce NCCL_ALGO", "Tree", f"{NCCL_CHOICE}, as on node[01-03]"),
        ("protocol_differs", "single-node allreduce AllReduce 1073741824", "LL", "SIMPLE, as on node[01-03]"),
        ("protocol_differs", "single-node allreduce NCCL_PROTO", "LL", f"{NCCL_CHOICE}, as on node[01-03]"),
    ]
    assert mechanism("node01", facts) == []


def test_a_secret_named_variable_nccl_took_is_masked() -> None:
    text, _ = captured("h200x4", "nccl-allreduce-p2p-cumem.txt")
    text = text.replace(
        "vm:4544:4544 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.",
        "vm:4544:4544 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.\n"
        "vm:4544:4544 [0] NCCL INFO NCCL_IB_AUTH_TOKEN set by environment to s3cr3t-Value-42\n"
        "vm:4544:4544 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to =eth0",
    )
    facts = read_account(entered(text), _run())  # as the rank's output entered the controller: masked there
    assert _by_rank(facts, "setting")[0] == {
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_IB_AUTH_TOKEN": "***",
        "NCCL_SOCKET_IFNAME": "=eth0",
    }
    assert not any("s3cr3t" in f.value for f in facts)


COMM = "h:7:7 [0] NCCL INFO comm 0xabc rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0\n"


@pytest.mark.parametrize(
    ("lines", "kind", "expected"),
    [
        (
            "32 coll channels, 32 nvls channels, 32 p2p channels, 32 p2p channels per peer",  # 2.18, 2.19
            "channels",
            {"coll": "32", "nvls": "32", "p2p": "32", "p2p_per_peer": "32"},
        ),
        (
            "8 coll channels, 8 p2p channels, 2 p2p channels per peer",
            "channels",
            {"coll": "8", "p2p": "8", "p2p_per_peer": "2"},
        ),
        (
            "Channel 00/02 :    0   1   2   3\nh:7:7 [0] NCCL INFO Channel 01/02 :    0   1   2   3",
            "channels",
            {"coll": "2"},
        ),  # no count line: the rings say it
        ("1073741824 Bytes -> Algo 1 proto 2 time 3947.640137", "algorithm", {"collective 1073741824": "RING"}),  # 2.21
        ("AllReduce: 1048576 Bytes -> Algo 0 proto 0 time 30.100000", "protocol", {"AllReduce 1048576": "LL"}),  # 2.23
        (
            "AllGather: 1073741824 Bytes -> Algo PAT proto SIMPLE channel{Lo..Hi}={0..31}",
            "algorithm",
            {"AllGather 1073741824": "PAT"},
        ),
        ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM", "channels", {}),  # a connection, not a ring
    ],
)
def test_the_shapes_other_nccl_versions_print(lines: str, kind: str, expected: dict[str, str]) -> None:
    facts = read_account(COMM + f"h:7:7 [0] NCCL INFO {lines}\n", _run())
    assert _by_rank(facts, kind) == ({0: expected} if expected else {})
    assert {f.communicator for f in facts} == {"0xabc"}


def test_a_communicators_line_before_any_communicator_is_not_guessed() -> None:
    assert (
        read_account("h:7:7 [0] NCCL INFO 24 coll channels, 32 p2p channels, 32 p2p channels per peer\n", _run()) == []
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("NET/Plugin: Loaded net plugin NCCL RDMA Plugin v8 (v8)", {"net": "NCCL RDMA Plugin v8"}),
        ("NET/Plugin: Loaded coll plugin SHARP (v7)", {"collnet": "SHARP"}),
        ("NET/Plugin: Loaded collnet plugin SHARP (v10)", {"collnet": "SHARP"}),
        (
            "NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin "
            "found (libnccl-net.so), using internal implementation",
            {"net": "none"},
        ),
        ("NET/Plugin: No plugin found (libnccl-net.so)", {"net": "none"}),
        ("TUNER/Plugin: Using internal tuner plugin.", {"tuner": "none"}),
        ("TUNER/Plugin: Could not find: libnccl-tuner.so. Using internal tuner plugin.", {"tuner": "none"}),
        ("TUNER/Plugin: Using tuner plugin example", {"tuner": "example"}),  # 2.21
        ("TUNER/Plugin: Using example (v3)", {"tuner": "example"}),
        ("PROFILER/Plugin: Loaded Example-profiler (v4)", {"profiler": "Example-profiler"}),
        ("PROFILER/Plugin: loaded ncclProfiler_v2.", {"profiler": "ncclProfiler_v2"}),
        (
            "Successfully loaded external network plugin /opt/aws-ofi-nccl/lib/libnccl-net.so",
            {"net": "/opt/aws-ofi-nccl/lib/libnccl-net.so"},
        ),
        ("Using network IB", {"network": "IB"}),
        ("Using network AWS Libfabric", {"network": "AWS Libfabric"}),
        ("Initialized NET plugin Socket", {}),
        ("ENV/Plugin: Closing env plugin ncclEnvDefault", {}),
    ],
)
def test_every_plugin_line_shape(line: str, expected: dict[str, str]) -> None:
    facts = read_account(f"h:7:7 [0] NCCL INFO {line}\n", _run())
    assert _by_rank(facts, "plugin") == ({None: expected} if expected else {})


def test_a_plugin_loaded_after_a_name_not_found_stands() -> None:
    missing = "h:7:7 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net-ofi.so\n"
    loaded = "h:7:7 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v9)\n"
    assert _by_rank(read_account(missing + loaded, _run()), "plugin") == {None: {"net": "Libfabric"}}
    assert _by_rank(read_account(loaded + missing, _run()), "plugin") == {None: {"net": "Libfabric"}}


def test_the_facts_are_written_and_read_back_as_nccl_parquet(tmp_path: Path) -> None:
    facts = _cluster(_fewer_channels_by_p2p_level(), healthy=1)
    path = write_table(tmp_path / "nccl.parquet", facts, NCCL)
    table = pq.read_table(path)
    assert table.schema.metadata[b"cluster_accept_schema"] == b"nccl"
    assert [NcclFact.from_record(r) for r in table.to_pylist()] == facts
    assert table.num_rows == 60 + 64


def test_the_report_shows_the_account_folded_into_node_sets(tmp_path: Path) -> None:
    facts = _cluster(_fewer_channels_by_p2p_level())
    run = {"run_id": "r1", "cluster": "c", "stages": ["single-node"], "started": "s", "ended": "e", "inventory": "i"}
    verdicts = [VerdictRow("r1", "c", f"node{i:02d}", "p", Verdict.ACCEPTED) for i in range(1, 5)]
    context = build_context(run, verdicts, ReportData(links=(), nccl=[f.record() for f in facts]))
    assert context["nccl_account"] == account_lines(facts)
    html, md = render(context, tmp_path)
    said = "24 channels (32 p2p) on node[01-03]; 4 channels (4 p2p) on node04"
    assert "## NCCL's own account" in md.read_text()
    assert f"- **channels (single-node allreduce, 4 ranks on 1 node)**: {said}" in md.read_text()
    assert said in html.read_text()
    nothing = build_context(run, verdicts, ReportData(links=()))
    assert nothing["nccl_account"] == []
    assert "NCCL's own account" not in render(nothing, tmp_path)[1].read_text()


def _inventory(names: tuple[str, ...] = ("n1", "n2")) -> Inventory:
    profile = Profile()
    nodes = [Node(name=n, ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS) for n in names]
    return Inventory("c", nodes, {"p": profile}, "inventory.yaml", "digest")


def test_the_single_node_stage_keeps_each_runs_account() -> None:
    good, _ = captured("h200x4", "nccl-allreduce-p2p-cumem.txt")
    slow = _fewer_channels_by_p2p_level()
    outcomes = [
        NodeResult(name, NodeStatus.OK, commands=[CommandResult("allreduce", 0, text, "")])
        for name, text in (("n1", good), ("n2", slow))
    ]
    judged = judge_nodes("r1", _inventory(), outcomes)
    assert judged.nccl == read_account(good, NcclRun("r1", "c", "single-node", "n1", "allreduce")) + read_account(
        slow, NcclRun("r1", "c", "single-node", "n2", "allreduce")
    )
    assert len(judged.nccl) == 60 + 64
    assert "nccl" in SINGLE_NODE.tables and "nccl" in MULTI_NODE.tables


def test_the_multi_node_stage_keeps_each_ranks_account_with_its_group(tmp_path: Path) -> None:
    """Every rank's log of a run between nodes, whatever the run's outcome; kept in the stage's checkpoint."""
    log, _ = captured("h200x4", "nccl-allreduce-socket.txt")
    inventory = _inventory()
    ranks = {n: RankRun(n, NodeStatus.OK, result=CommandResult("allreduce_inter", 0, log, "")) for n in ("n1", "n2")}
    stage = _Stage("r1", inventory)
    stage._record([inventory.node("n1"), inventory.node("n2")], GroupRun(("n1", "n2"), "t", ranks), ALLREDUCE_JOB)
    facts = facts_of(stage.out.nccl)
    assert len(facts) == 2 * 68
    assert {(f.node, f.stage, f.probe, f.group) for f in facts} == {
        ("n1", "multi-node", "allreduce", "n[1-2]"),
        ("n2", "multi-node", "allreduce", "n[1-2]"),
    }
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save_stage("multi-node", SavedOutcome.of(stage.out))
    saved = checkpoints.load_stage("multi-node", SavedOutcome)
    assert saved is not None and saved.outcome().nccl == stage.out.nccl


def test_the_run_writes_the_account_to_nccl_parquet(tmp_path: Path) -> None:
    facts = _cluster(_fewer_channels_by_p2p_level(), healthy=1)
    state = SimpleNamespace(run_dir=SimpleNamespace(path=tmp_path), tables=RunTables(nccl=list(facts)))
    write_tables(cast(Any, state), ("nccl",))
    assert facts_of(pq.read_table(tmp_path / "nccl.parquet").to_pylist()) == facts


def test_odd_numbers_are_not_read_as_counts_and_never_raise() -> None:
    huge = "9" * 5000
    log = (
        f"h:7:7 [0] NCCL INFO comm 0xabc rank 0 nRanks {huge} nNodes 1 localRanks 8 localRank 0 MNNVL 0\n"
        "h:7:7 [0] NCCL INFO comm 0xabc rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0\n"
        f"h:7:7 [0] NCCL INFO {huge} coll channels, 8 p2p channels, 2 p2p channels per peer\n"
        f"h:7:7 [0] NCCL INFO Channel 00/{huge} :    0   1\n"
        f"h:7:7 [0] NCCL INFO 1048576 Bytes -> Algo {huge} proto 2 time 1.0\n"
    )
    facts = read_account(log, _run())
    assert _by_rank(facts, "channels") == {0: {"p2p": "8", "p2p_per_peer": "2"}}
    assert _by_rank(facts, "algorithm") == {0: {"collective 1048576": huge}}
    odd = [replace(f, name="coll", value="²") if f.name == "p2p" else f for f in facts]  # a row read back
    assert mechanism("node01", odd, nvlinks_per_gpu=18) == []
    assert [what for what, _ in account_lines(odd)] == [
        "settings NCCL took (single-node allreduce)",
        "algorithm (single-node allreduce collective 1048576)",
        "protocol (single-node allreduce collective 1048576)",
    ]
