"""``cluster-accept watch`` of a Slurm job on the test-bed: a plain data-parallel training job (the project's training
step under torchrun, DDP over gloo, one rank a node) on four nodes of a real Slurm, armed by the TaskProlog that
``cluster-accept arm`` prints, nothing in the job's code.

One node's link limited by tc: the ranks whose collectives cross that link arrive late, and their hosts show no wait
for a CPU, so the watch cannot tell compute from communication and says so, naming the late rank's ring neighbours
beside it. The job's owner cancels the job; the re-test measures their compute and links beside the nodes the finding
does not involve, rejects the slow link's node, names it and drains it (``--drain --apply``); no other node is named
as the cause, none other drained.

One node's core shared with a busy process: its rank arrives last and waits for a CPU far more than its peers', so
the watch names it a compute straggler; the re-test measures its compute beside its peers, confirms it and drains
it, no other node named or drained."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.ops.slurm import read_nodes
from cluster_accept.testbed import bed as testbed
from tests.processes import run_cli, start_cli
from tests.watch_job import JOB_FILES, MODEL, SHIM, pin, prioritize_hog

pytestmark = [pytest.mark.testbed, pytest.mark.soak]  # docs/development.md: the soak tier

NODES = ("node01", "node02", "node03", "node04")
SLOW_NODE = "node03"
SLOW_MBIT = 150  # the job's gradients (about 10 MB a step) take about a second a step over it
NAME_BOUND_S = 240.0  # a node must be named within this after the watch starts
BUSY_NODE = "node02"
# Beside the busy node's rank on its core, at a priority far above it (nice -15: about 28 times its weight): the rank
# keeps a few per cent of the core and waits for it nearly all its runnable time, where the three others, sharing the
# other core, wait about two thirds of theirs.
BUSY = "exec nice -n -15 {python} -c 'while 1: pass'"
BUSY_NICE = -15
# The busy node's job a smaller model (gradients of about 1 MB): at a few per cent of a core its rank still steps
# about once a second, enough collectives in the window to be judged.
SMALL_MODEL = "--layers 1 --width 128 --heads 2 --seq-len 64 --micro-batch 4 --vocab 1024"


@pytest.fixture
def slurm_bed(testbed_factory, monkeypatch) -> Iterator[testbed.Testbed]:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=4, prefix="wsl", subnet="10.254.204.0/24", slurm=True)
    for key, value in bed.slurm_env.items():
        monkeypatch.setenv(key, value)
    yield bed
    testbed.set_rate(bed, SLOW_NODE, None)
    subprocess.run(["scancel", "--full", "--state=RUNNING"], capture_output=True, timeout=60, check=False)
    for node in NODES:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True, check=False)


def _inventory(bed: testbed.Testbed, path: Path, straggler_pct: float = 25) -> Path:
    """The test-bed's inventory with relative findings rejecting, a node ``straggler_pct`` under its peers slow."""
    inventory = yaml.safe_load(bed.inventory_path.read_text())
    thresholds = inventory["profiles"]["testbed-h200x4"]["thresholds"]
    thresholds.update(straggler_pct=straggler_pct, relative_verdict="fail")
    path.write_text(yaml.safe_dump(inventory))
    return path


def _task_prologs(watch: Path, work: Path) -> Path:
    """What ``cluster-accept arm`` prints for each node (its watch directory is the node's own: the test-bed's nodes
    share one filesystem), and one TaskProlog that runs the node's (Slurm gives a task its node's name)."""
    watch.mkdir(mode=0o1777)
    watch.chmod(0o1777)  # root's, as docs/watch-signals.md has it
    for node in NODES:
        (watch / node).mkdir(mode=0o1777)
        (watch / node).chmod(0o1777)
        armed = run_cli("arm", "--format", "taskprolog", "--watch-dir", str(watch / node), "--shim-dir", str(SHIM),
                        "--torch", _torch_version())  # fmt: skip
        assert armed.returncode == 0, armed.stdout + armed.stderr
        prolog = work / f"prolog-{node}.sh"
        prolog.write_text(armed.stdout)
        prolog.chmod(0o755)
    dispatch = work / "task-prolog.sh"
    dispatch.write_text(f'#!/bin/sh\nexec "{work}/prolog-${{SLURMD_NODENAME}}.sh"\n')
    dispatch.chmod(0o755)
    return dispatch


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _submit(bed: testbed.Testbed, work: Path, prolog: Path, port: int, model: str = MODEL) -> str:
    """The job as its owner writes it: sbatch, then one torchrun a node through srun, with the TaskProlog."""
    code = work / "job"
    code.mkdir(parents=True, exist_ok=True)
    for path in JOB_FILES:
        (code / path.name).write_bytes(path.read_bytes())
    train = (
        f"exec {sys.executable} -m torch.distributed.run --nnodes 4 --node-rank $SLURM_NODEID --nproc-per-node 1 "
        f"--master-addr {bed.nodes['node01']} --master-port {port} train_step.py --device cpu {model} "
        "--steps 1000000 --warmup-steps 1 --solo-steps 1"
    )
    script = work / "job.sh"
    script.write_text(
        "#!/bin/sh\nexport GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1\n"
        f"exec srun --ntasks-per-node=1 --task-prolog={prolog} sh -c '{train}'\n"
    )
    argv = ["sbatch", "--parsable", "--nodes=4", "--ntasks-per-node=1", f"--chdir={code}",
            f"--output={work}/job-%j.out", str(script)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip().split(";")[0]


def _wait_armed(watch: Path, job: str, work: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        socks = [p for node in NODES for p in (watch / node / job).glob("rank*.sock")]
        if len(socks) == len(NODES):
            time.sleep(5)  # past init and the solo steps: training
            return
        time.sleep(0.5)
    outputs = [p.read_text()[-3000:] for p in work.glob("job-*.out")]
    raise AssertionError(f"the job's ranks never armed: {outputs}")


def _findings(out: Path) -> pd.DataFrame:
    (watch_dir,) = [p for p in out.iterdir() if (p / "watch_findings.parquet").exists()]
    return pd.read_parquet(watch_dir / "watch_findings.parquet")


def _named(out: Path, within_s: float) -> pd.Series:
    """The first failing row the running watch under ``out`` has written, within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            rows = _findings(out)
        except (ValueError, OSError):  # not written yet, or being written
            rows = pd.DataFrame(columns=["status"])
        failing = rows[rows.status == "fail"]
        if not failing.empty:
            return failing.iloc[0]
        time.sleep(1)
    raise AssertionError(f"nothing named within {within_s:g} s")


def _watch(
    inventory: Path, job: str, watch: Path, out: Path, on_named: Callable[[], None] = lambda: None
) -> tuple[pd.DataFrame, str]:
    """Watch the job until a node is named, call ``on_named``, cancel the job as its owner would, and wait for the
    re-test: the rows and what the watch printed."""
    began_ns = time.time_ns()
    argv = ["watch", "--inventory", str(inventory), "--slurm-job", job, "--out", str(out), "--watch-dir",
            f"{watch}/{{node}}", "--interval", "2", "--window", "60", "--hang-after", "60", "--for", "900",
            "--until-named", "--drain", "--apply"]  # fmt: skip
    watching = start_cli(*argv)
    try:
        first = _named(out, NAME_BOUND_S)
        print(f"named after {(first.named_ns - began_ns) / 1e9:.0f} s of watching: {first.to_dict()}")
        on_named()
        subprocess.run(["scancel", job], capture_output=True, timeout=60, check=True)  # the owner takes it down
        stdout, stderr = watching.communicate(timeout=900)
    finally:
        watching.kill()
    print(stdout, stderr)
    assert watching.returncode == 1, stdout + stderr
    return _findings(out), stdout + stderr


def _drained_alone(node: str) -> None:
    nodes, error = read_nodes()
    assert not error, error
    assert {name for name, seen in nodes.items() if seen.drained} == {node} and nodes[node].drained_by_us, nodes


def test_a_slow_link_under_a_slurm_ddp_job_is_named_on_its_node_and_drained(slurm_bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = slurm_bed
    # Two pairs measured at once share this machine's two cores: beside the slow link's pair, a healthy pair measured
    # 0.27 GB/s where it had measured 0.71 alone; the slow link's pairs measured 0.018. Slow is under a third.
    inventory = _inventory(bed, tmp_path / "inventory.yaml", straggler_pct=70)
    watch = tmp_path / "watch"
    job = _submit(bed, tmp_path, _task_prologs(watch, tmp_path), 29631)
    _wait_armed(watch, job, tmp_path)
    testbed.set_rate(bed, SLOW_NODE, SLOW_MBIT)
    try:
        rows, said = _watch(inventory, job, watch, tmp_path / "out")
    finally:
        testbed.set_rate(bed, SLOW_NODE, None)
    named = rows[rows.status.isin(["fail", "warn"])]
    assert list(named.node) == [SLOW_NODE], named.to_dict("records")  # the slow link's node, and no other
    (link,) = named.itertuples()
    assert link.confirmed and link.action == "drained", link
    assert link.owner_line.startswith(f"exclude {SLOW_NODE}:"), link.owner_line
    if link.kind == "comm_straggler":  # named through the late rank it sends to
        assert link.reason == "slow_link_neighbour" and link.involves, link
        late = rows[(rows.node == link.involves) & (rows.kind == "compute_straggler")].iloc[0]
        assert late.status == "pass" and late.reason == "late_by_neighbour", late.to_dict()
    else:  # its own rank late: named unresolved, the re-test said which
        assert (link.kind, link.reason) == ("compute_straggler", "late_unresolved"), link
    _drained_alone(SLOW_NODE)
    assert f"exclude {SLOW_NODE}:" in said, said


def test_a_node_whose_core_is_shared_under_a_slurm_job_is_named_as_compute(slurm_bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = slurm_bed  # a node at half its peers' speed is rejected
    for node in NODES:  # the busy node's rank on a core of its own with the busy process, the others on the other
        pin(bed, node, {0} if node == BUSY_NODE else {1}, b"slurmd")
    pin(bed, BUSY_NODE, {0}, b"sshd")
    inventory = _inventory(bed, tmp_path / "inventory.yaml")
    watch = tmp_path / "watch"
    job = _submit(bed, tmp_path, _task_prologs(watch, tmp_path), 29632, SMALL_MODEL)
    _wait_armed(watch, job, tmp_path)
    hog = subprocess.Popen(bed.ssh_argv(BUSY_NODE, BUSY.format(python=sys.executable)))
    prioritize_hog(bed, BUSY_NODE, BUSY_NICE)
    try:
        # named: the busy process's share eased to a quarter of the core (nice -5), as the watch's own test has it,
        # so that the re-test's probes on that core take four times as long rather than thirty
        rows, said = _watch(inventory, job, watch, tmp_path / "out", lambda: prioritize_hog(bed, BUSY_NODE, -5))
    finally:
        hog.kill()
        subprocess.run(bed.ssh_argv(BUSY_NODE, "pkill -KILL -f 'while 1'"), check=False)
    named = rows[rows.status.isin(["fail", "warn"])]
    assert list(named.node) == [BUSY_NODE], named.to_dict("records")
    (busy,) = named.itertuples()
    assert (busy.kind, busy.reason) == ("compute_straggler", "arrives_last"), busy
    assert busy.confirmed and busy.action == "drained" and "waited for a CPU" in busy.evidence, busy
    _drained_alone(BUSY_NODE)
    assert f"exclude {BUSY_NODE}:" in said, said
