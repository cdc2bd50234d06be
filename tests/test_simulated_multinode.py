"""Multi-node runs on simulated nodes: the detached-rank protocol answered in-process, a group's figures computed
from its members (its slowest member's factor, a broken member failing it as the recorded run failed), and the
whole multi-node stage — sweep, isolation, bisect — on them, through the real flow."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.flows.acceptance import bisect, run_acceptance
from cluster_accept.inventory.load import load_inventory
from cluster_accept.remote.detached import tag_pattern
from cluster_accept.remote.result import PollAnswer, RemoteCommand, Rendezvous
from cluster_accept.rundir.run import refuse_unresolved_auto
from cluster_accept.simulator.launch import (
    ADDR_TOKEN,
    NO_STATUS,
    PORT_TOKEN,
    TAG_TOKEN,
    Member,
    group_answers,
    launch_key,
    rank_key,
)
from cluster_accept.simulator.nodes import NODE_TOKEN, Answer, Recording, SimulatedNode, SimulatedSession
from cluster_accept.testbed.profile import base_profile
from tests.processes import only_run, run_verdicts

RECORDING = Path(__file__).resolve().parent.parent / "bench" / "sim" / "testbed-h200x4.json"


def rank(world: int = 4, node_rank: int = 2, tag: str = "0a1b2c") -> RemoteCommand:
    """A rank's command as the launcher builds it: its text, and its run's values typed beside it."""
    script = (
        f'cd "$CA_PROBE_DIR" && n=1; exec env NCCL_DEBUG=INFO /usr/bin/python3 -m torch.distributed.run '
        f"--nnodes={world} --nproc_per_node=$n --node_rank={node_rank} --master_addr=gpu0001 --master_port=29511 "
        f"--rdzv-conf=timeout=120 allreduce.py --device cpu --label inter_node --tag {tag} --min-bytes 1048576 2>&1"
    )
    return RemoteCommand("allreduce_inter", script, rendezvous=Rendezvous(world, node_rank, "gpu0001", 29511, tag, 120))


ARGS = Rendezvous(world=4, rank=2, addr="gpu0001", port=29511, tag="0a1b2c", wait_s=120.0)
KEY = rank_key(rank()) or ""
FIGURES = {"metric": "allreduce_busbw_gbps", "collective": "all_reduce", "value": 0.4, "algbw_gbps": 0.4}


def test_a_rank_command_names_its_run_and_keys_its_recorded_answer() -> None:
    assert rank().rendezvous == ARGS
    assert all(token in KEY for token in ("--nnodes=@@NNODES@@", "--node_rank=@@RANK@@", ADDR_TOKEN, PORT_TOKEN))
    assert "0a1b2c" not in KEY and "29511" not in KEY and "--tag @@TAG@@" in KEY
    assert rank_key(rank(64, 0, "ffee")) == KEY  # any rank of any run of the same command: one recorded answer
    assert rank_key(RemoteCommand("allreduce_inter", rank().script)) is None  # no rendezvous: no rank of a run


def _recording() -> Recording:
    first = json.dumps({"info": "probe", "world_size": 2}) + "\n" + json.dumps({**FIGURES, "world_size": 2}) + "\n"
    peer = f"{NODE_TOKEN} joined {ADDR_TOKEN}:{PORT_TOKEN} {TAG_TOKEN}\n"
    return Recording(
        launches={
            "healthy": {launch_key(2, "0", KEY): Answer(0, first), launch_key(2, "n", KEY): Answer(0, peer)},
            "net_stalled": {
                launch_key(2, "0", KEY): Answer(124, "peer: SignalException 15\n"),
                launch_key(2, "n", KEY): Answer(124, "self: SignalException 15\n"),
            },
            "hung": {launch_key(2, "0", KEY): Answer(NO_STATUS, ""), launch_key(2, "n", KEY): Answer(1, "crashed")},
        }
    )


def test_a_group_is_as_fast_as_its_slowest_member_told_for_its_node_count() -> None:
    members = [Member("gpu0001", "healthy", 1.0), Member("gpu0002", "healthy", 0.5)]
    members += [Member("gpu0003", "healthy", 0.98), Member("gpu0004", "gpu_missing", 1.02)]
    answers = group_answers(_recording(), KEY, members, ARGS)
    info, figure = [json.loads(line) for line in answers[0].stdout.splitlines()]
    assert info == {"info": "probe", "world_size": 4}
    # busbw 0.4 recorded on 2 nodes; on 4 nodes algbw = 0.4 * 4 / 6 = 0.2667; both halved by gpu0002
    assert figure == {**FIGURES, "value": 0.2, "algbw_gbps": 0.13335, "world_size": 4}
    assert [a.exit_code for a in answers] == [0, 0, 0, 0]  # a preflight fault answers the run as a healthy node
    assert answers[3] == Answer(0, "gpu0004 joined gpu0001:29511 0a1b2c\n")
    fast = group_answers(_recording(), KEY, [members[0], members[2]], ARGS)
    assert json.loads(fast[0].stdout.splitlines()[1])["value"] == 0.392  # 0.4 * 0.98: its own slowest member


def test_a_broken_member_fails_its_group_as_the_recorded_run_failed() -> None:
    members = [Member("gpu0001", "healthy", 1.0), Member("gpu0002", "net_stalled", 1.0), Member("gpu0003", "slow", 0.5)]
    answers = group_answers(_recording(), KEY, members, ARGS)
    assert [(a.exit_code, a.stdout) for a in answers] == [
        (124, "peer: SignalException 15\n"),
        (124, "self: SignalException 15\n"),
        (124, "peer: SignalException 15\n"),
    ]
    hung = group_answers(_recording(), KEY, [Member("a", "hung", 1.0), Member("b", "healthy", 1.0)], ARGS)
    assert [a.exit_code for a in hung] == [1, NO_STATUS]  # its peer waits until the run is stopped
    unknown = group_answers(_recording(), KEY.replace("allreduce.py", "train_step.py"), members[:1], ARGS)
    assert unknown[0].exit_code == 127 and "no recorded multi-node answer" in unknown[0].stderr


def _start(session: SimulatedSession, node_rank: int, tag: str) -> tuple[str, int]:
    """A rank started as the launcher starts it: a directory, then the detached start of its command."""
    remote_dir = session.make_probe_dir(60)
    pid = session.start_detached(remote_dir, rank(2, node_rank, tag), 120.0, tag)
    assert isinstance(pid, int), pid
    return remote_dir, pid


def _poll(session: SimulatedSession, remote_dir: str, pid: int, stop: str | None = None) -> tuple[bool, int | None]:
    answer = session.poll_detached(remote_dir, pid, stop)
    assert isinstance(answer, PollAnswer)
    return answer.running, answer.exit_code


def test_simulated_ranks_answer_the_detached_protocol() -> None:
    recording = _recording()
    first, second = (SimulatedSession(SimulatedNode(f"gpu000{i}"), recording) for i in (1, 2))
    one = _start(first, 0, "aa11")
    assert _poll(first, *one) == (True, None)  # waits for its peer at the rendezvous
    two = _start(second, 1, "aa11")
    assert _poll(first, *one) == (False, 0) and _poll(second, *two) == (False, 0)
    assert _poll(first, *one) == (False, None)  # collected: its directory is gone
    alone = _start(first, 0, "bb22")
    assert _poll(first, *alone, tag_pattern("bb22")) == (False, None)  # stopped: no exit status
    refused = first.start_detached(first.make_probe_dir(60), RemoteCommand("x", "lspci -vv"), 60.0, "cc33")
    assert not isinstance(refused, int) and "not a rank of a multi-node run" in refused.why
    batch = first.run_batch([RemoteCommand("lspci", "lspci -vv")], 60.0)
    assert batch.commands[0].exit_code == 127 and "no recorded answer" in batch.commands[0].stderr


def _inventory(tmp_path: Path, nodes: int, faults: dict[str, str]) -> Path:
    """A simulated cluster judged as the test-bed's, a node halving its groups' figures found by 25 %."""
    profile = base_profile("h200x4", python=Recording.load(RECORDING).python)
    profile["thresholds"]["straggler_pct"] = 25
    data = {
        "cluster": "simmn",
        "defaults": {"profile": "testbed-h200x4"},
        "nodes": [{"hosts": f"gpu[0001-{nodes:04d}]"}],
        "simulation": {"recording": str(RECORDING), "faults": faults, "latency_ms": 2},
        "profiles": {"testbed-h200x4": profile},
    }
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.integration
def test_the_multi_node_stage_isolates_a_slow_simulated_node_and_bisect_finds_it(tmp_path: Path) -> None:
    path = _inventory(tmp_path, 32, {"gpu0011": "slow", "gpu0020": "gpu_missing"})
    outcome = run_acceptance(path, tmp_path / "runs", stages=["preflight", "single-node", "multi-node"], history="-")
    assert outcome.exit_code == 1
    got = run_verdicts(tmp_path / "runs")
    assert got["gpu0011"] == ("rejected", ["isolation:slow_node"])
    assert got["gpu0020"][0] == "rejected" and "gpu_count:count_low" in got["gpu0020"][1]
    assert {n for n, (v, _) in got.items() if v != "accepted"} == {"gpu0011", "gpu0020"}
    rounds = pd.read_parquet(only_run(tmp_path / "runs") / "isolation.parquet")
    assert set(rounds.phase) >= {"screen", "confirm"} and rounds["round"].max() <= 3
    out = tmp_path / "bisect"
    bisect(str(path), "gpu[0009-0012]", good="gpu[0001-0002]", out_dir=str(out), history="-")
    got = run_verdicts(out)
    assert got["gpu0011"] == ("rejected", ["isolation:slow_node"])
    assert {n for n, (v, _) in got.items() if v != "accepted"} == {"gpu0011"}


def test_simulated_stages_beyond_the_recording_are_refused(tmp_path: Path) -> None:
    inventory = load_inventory(_inventory(tmp_path, 4, {}))
    refuse_unresolved_auto(inventory, ["preflight", "multi-node"])
    with pytest.raises(ValueError, match="not burn"):
        refuse_unresolved_auto(inventory, ["preflight", "burn"])
    path = tmp_path / "sim.yaml"
    data = yaml.safe_load(path.read_text())
    data["profiles"]["testbed-h200x4"]["training"] = {"enabled": True}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="training, rails or collectives"):
        refuse_unresolved_auto(load_inventory(path), [])  # bisect
