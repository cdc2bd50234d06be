"""The watch's node-side readers against files a hostile or careless job user leaves: a rank file that is a link
to ``/dev/zero``, a FIFO, ``[1]``, a directory, another user's file; a rank's socket that is a link to another
socket, or whose listener is not the rank; a job directory another user prepared in advance (the tests run as
root and hand files to uid 65534 to play the other user). Each is named for its own rank or directory, the
other ranks are read, and nothing is sent to a socket that is not the rank's own."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cluster_accept.watch.arming import ArmSettings, NodeVersions, arm_node, taskprolog_script
from cluster_accept.watch.read import ReadWindow, parse_node_read

NODE = Path(__file__).resolve().parent.parent / "cluster_accept" / "watch" / "node"
READER = NODE / "job_read.py"
OTHER_UID = 65534  # the other user (nobody)
SQUATTER_UID = 65533
DATA = Path(__file__).resolve().parent / "data" / "watch"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _job_dir(tmp_path: Path, name: str = "j1") -> Path:
    """``<base>/<name>`` as the shim leaves it: the base root's and sticky, the job's directory root's, 0700."""
    base = tmp_path / "watch"
    base.mkdir(exist_ok=True)
    base.chmod(0o1777)
    job = base / name
    job.mkdir(mode=0o700)
    return job


def _rank_file(job: Path, rank: int, pid: int | None = None) -> Path:
    """A rank's record as the shim writes it; by default this very process, running."""
    pid = os.getpid() if pid is None else pid
    ticks = _start_ticks(pid) if Path(f"/proc/{pid}").exists() else 1
    record = {"rank": rank, "local_rank": rank, "pid": pid, "start_ticks": ticks, "hostname": "n", "gpu": rank,
              "started_ns": 1, "world_size": 2, "job": job.name, "detail": ""}  # fmt: skip
    path = job / f"rank{rank}.json"
    path.write_text(json.dumps(record))
    return path


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _read_in_process(
    job: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *extra: str
) -> list[dict[str, Any]]:
    reader = _load(READER)
    monkeypatch.setattr(reader, "clock", dict)  # the clock's libc is found by starting a process
    monkeypatch.setattr(sys, "argv", ["job_read.py", "--dir", str(job), "--timeout-s", "2", *extra])
    assert reader.main() == 0
    return _lines(capsys.readouterr().out)


def _read_in_subprocess(job: Path, timeout_s: float = 30) -> tuple[list[dict[str, Any]], float]:
    """The reader as the watcher runs it, its memory held to 1 GiB: (its lines, how long it took)."""

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    began = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(READER), "--dir", str(job), "--timeout-s", "2"],
            capture_output=True, text=True, timeout=timeout_s, preexec_fn=cap_memory,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"the reader did not return within {timeout_s:g} s")
    assert done.returncode == 0, done.stderr[-2000:]
    return _lines(done.stdout), time.monotonic() - began


def _problems(lines: list[dict[str, Any]], job: Path) -> tuple[list[int], list[str]]:
    """(the ranks read, the problems) as the watcher parses the reader's answer."""
    text = "\n".join(json.dumps(line) for line in lines)
    read = parse_node_read(text, "j1", "n", ReadWindow(0, 1))
    return sorted(r.rank for r in read.ranks), read.problems


# A rank's file ------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_rank_file_linked_to_dev_zero_is_named_unreadable_and_the_other_rank_is_read(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    _rank_file(job, 0, pid=2**22 + 7)  # a rank gone without its exit mark
    (job / "rank1.json").symlink_to("/dev/zero")
    lines, took = _read_in_subprocess(job)
    assert took < 20
    ranks, problems = _problems(lines, job)
    assert ranks == [0]
    assert problems == ["rank 1 unreadable (rank1.json): a link, not followed"]


@pytest.mark.integration
def test_a_fifo_rank_file_does_not_block_the_reader(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    _rank_file(job, 0, pid=2**22 + 7)
    os.mkfifo(job / "rank1.json")  # nobody ever writes to it
    lines, took = _read_in_subprocess(job, timeout_s=20)
    assert took < 10
    ranks, problems = _problems(lines, job)
    assert ranks == [0]
    assert problems == ["rank 1 unreadable (rank1.json): a FIFO, not a regular file"]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("[1]", "a JSON list, not an object"),
        ('"rank"', "a JSON str, not an object"),
        ('{"rank": 1, "local_rank": 0, "pid": "12"}', "key 'pid' is \"12\", not int"),
        ('{"rank": 1, "local_rank": true, "pid": 12}', "key 'local_rank' is true, not int"),
        ('{"rank": 3, "local_rank": 0, "pid": 12}', "rank 3, pid 12: not rank 1 as its name says"),
        ("{", "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ],
)
def test_a_rank_file_of_another_shape_is_named_for_that_rank_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, content: str, why: str
) -> None:
    job = _job_dir(tmp_path)
    _rank_file(job, 0, pid=2**22 + 7)
    (job / "rank1.json").write_text(content)
    _rank_file(job, 2, pid=2**22 + 9)
    ranks, problems = _problems(_read_in_process(job, capsys, monkeypatch), job)
    assert ranks == [0, 2]
    assert problems == [f"rank 1 unreadable (rank1.json): {why}"]


def test_a_directory_or_another_users_file_in_place_of_a_rank_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job_dir(tmp_path)
    _rank_file(job, 0, pid=2**22 + 7)
    (job / "rank1.json").mkdir()
    os.chown(_rank_file(job, 2, pid=2**22 + 9), OTHER_UID, OTHER_UID)
    (job / "rank3.json").write_bytes(b"{" + b" " * (70 << 10) + b"}")
    ranks, problems = _problems(_read_in_process(job, capsys, monkeypatch), job)
    assert ranks == [0]
    assert problems == [
        "rank 1 unreadable (rank1.json): a directory, not a regular file",
        f"rank 2 unreadable (rank2.json): owned by uid {OTHER_UID}, not the job's user 0",
        f"rank 3 unreadable (rank3.json): larger than {64 << 10} bytes: not read",
    ]


# A rank's socket ----------------------------------------------------------------------------------------------


class Listener:
    """A Unix socket server that answers nothing and keeps what it was sent, per connection."""

    def __init__(self, path: Path) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen()
        self.server.settimeout(0.2)
        self.received: list[bytes] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1.0)
                data = b""
                with contextlib.suppress(OSError):
                    while chunk := conn.recv(4096):
                        data += chunk
                self.received.append(data)

    def close(self) -> list[bytes]:
        self.stopped.set()
        self.thread.join(timeout=5)
        self.server.close()
        return self.received


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A process of this user that is not this one: a rank whose socket someone else listens on."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


@pytest.mark.integration
def test_a_sock_link_to_another_socket_is_never_sent_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job_dir(tmp_path)
    _rank_file(job, 0)  # this process: running
    listener = Listener(tmp_path / "another.sock")
    (job / "rank0.sock").symlink_to(tmp_path / "another.sock")
    try:
        lines = _read_in_process(job, capsys, monkeypatch)
    finally:
        received = listener.close()
    assert received == []
    (rank,) = [line["rank"] for line in lines if "rank" in line]
    assert (rank["state"], rank["answered"]) == ("running", False)
    assert rank["detail"] == "flight recorder not asked: rank0.sock is a link, not followed: not asked"


@pytest.mark.integration
def test_a_socket_whose_listener_is_not_the_rank_is_not_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, sleeper: int
) -> None:
    job = _job_dir(tmp_path)
    _rank_file(job, 0, pid=sleeper)  # the rank is the sleeper; this process listens on its socket
    listener = Listener(job / "rank0.sock")
    try:
        lines = _read_in_process(job, capsys, monkeypatch)
    finally:
        received = listener.close()
    assert received in ([], [b""])  # connected to read the listener's credentials, sent nothing
    (rank,) = [line["rank"] for line in lines if "rank" in line]
    assert rank["answered"] is False
    assert rank["detail"] == (
        f"flight recorder not asked: its listener is pid {os.getpid()} of uid 0, not the rank's pid {sleeper} "
        "of uid 0: not asked"
    )


# The job's directory ------------------------------------------------------------------------------------------


def _squatted(tmp_path: Path) -> Path:
    """``<base>/j1`` prepared by another user, with a forged record of a dead rank; the job's user's own ranks in
    ``<base>/j1.0``, where the shim goes when ``j1`` is not its."""
    forged = _job_dir(tmp_path, "j1")
    _rank_file(forged, 0, pid=2**22 + 7)
    for path in (forged / "rank0.json", forged):
        os.chown(path, OTHER_UID, OTHER_UID)
    _rank_file(_job_dir(tmp_path, "j1.0"), 0)
    return forged


def test_a_job_directory_prepared_by_another_user_is_named_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    forged = _squatted(tmp_path)
    lines = _read_in_process(forged, capsys, monkeypatch, "--user", "0")
    ranks = [line["rank"] for line in lines if "rank" in line]
    assert [(r["rank"], r["pid"], r["state"]) for r in ranks] == [(0, os.getpid(), "running")]
    _, problems = _problems(lines, forged)
    assert problems == [f"job directory: {forged}: prepared by uid {OTHER_UID}, not the job's user 0: skipped"]


def test_without_the_jobs_user_two_users_directories_are_named_and_neither_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    forged = _squatted(tmp_path)
    lines = _read_in_process(forged, capsys, monkeypatch)
    ranks, problems = _problems(lines, forged)
    assert ranks == []
    assert problems == [
        f"job directory: {forged.parent}: directories of 2 users for job j1 (j1 (uid {OTHER_UID}), j1.0 (uid 0)) "
        "and the job's user is not known: none is read"
    ]


def test_a_base_another_user_owns_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job_dir(tmp_path)
    _rank_file(job, 0)
    os.chown(job.parent, OTHER_UID, OTHER_UID)
    ranks, problems = _problems(_read_in_process(job, capsys, monkeypatch), job)
    assert ranks == []
    assert problems == [
        f"job directory: {job.parent}: owned by uid {OTHER_UID}, not root: its owner could replace any job's "
        f"directory in it; make it root's: install -d -m 1777 -o root {job.parent}"
    ]


def test_the_shim_never_writes_into_a_directory_another_user_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CA_WATCH_DIR", raising=False)  # loaded without arming this process
    shim = _load(NODE / "sitecustomize.py")
    base = _job_dir(tmp_path, "j1").parent
    os.chown(base / "j1", OTHER_UID, OTHER_UID)
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", f"{base}/j1/fr_rank_")
    assert shim._job_dir(str(base), "j1") == f"{base}/j1.0"
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == f"{base}/j1.0/fr_rank_"
    (base / "j2").mkdir()
    (base / "j2.0").mkdir()
    for path in (base / "j2", base / "j2.0"):
        os.chown(path, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("NCCL_INSPECTOR_DUMP_DIR", f"{base}/j2/inspector")
    with pytest.raises(OSError, match="are other users' directories"):
        shim._job_dir(str(base), "j2")
    assert "NCCL_INSPECTOR_DUMP_DIR" not in os.environ  # NCCL is not sent into the other user's directory


@pytest.mark.integration
def test_an_armed_rank_leaves_its_files_in_its_own_directory_when_another_user_took_the_jobs(
    tmp_path: Path,
) -> None:
    base = _job_dir(tmp_path, "j1").parent
    os.chown(base / "j1", OTHER_UID, OTHER_UID)
    (tmp_path / "torch").mkdir()  # no worker server: the files are what is looked at, and torch takes seconds
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('not here')\n")
    env = {**os.environ, "PYTHONPATH": f"{NODE}:{tmp_path}", "CA_WATCH_DIR": str(base), "CA_WATCH_JOB": "j1",
           "RANK": "0", "LOCAL_RANK": "0", "TORCH_FR_DUMP_TEMP_FILE": f"{base}/j1/fr_rank_"}  # fmt: skip
    said = "import os; print(os.environ.get('TORCH_FR_DUMP_TEMP_FILE', ''))"
    done = subprocess.run([sys.executable, "-c", said], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"{base}/j1.0/fr_rank_"
    assert list((base / "j1").iterdir()) == []
    assert {p.name for p in (base / "j1.0").iterdir()} >= {"rank0.json", "rank0.exit"}


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A base another user can reach (pytest's own temporary directories are root's alone), root's and sticky."""
    base = Path(tempfile.mkdtemp(prefix="ca_watch_", dir="/tmp"))
    base.chmod(0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base)


def _taskprolog(base: Path, job: str) -> subprocess.CompletedProcess[str]:
    """The rendered TaskProlog run by the shell slurmstepd uses, as the job's user (uid 65534)."""
    plan = arm_node(NodeVersions("n", "2.13.0", "2.29.7", "/opt/nccl/lib/x.so", False), ArmSettings(str(base), "/s"))
    return subprocess.run(
        ["/bin/sh", "-c", taskprolog_script(plan)], env={"SLURM_JOB_ID": job, "PATH": "/usr/bin:/bin"},
        user=OTHER_UID, group=OTHER_UID, extra_groups=[], capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@pytest.mark.integration
def test_the_taskprolog_arms_a_directory_of_the_jobs_user_never_one_prepared_by_another(open_base: Path) -> None:
    (open_base / "77").mkdir()
    os.chown(open_base / "77", SQUATTER_UID, SQUATTER_UID)
    done = _taskprolog(open_base, "77")
    exports = dict(line.removeprefix("export ").split("=", 1) for line in done.stdout.splitlines())
    assert exports["CA_WATCH_JOB"] == "77"
    assert exports["NCCL_INSPECTOR_DUMP_DIR"] == f"{open_base}/77.{OTHER_UID}/inspector"
    assert exports["TORCH_FR_DUMP_TEMP_FILE"] == f"{open_base}/77.{OTHER_UID}/fr_rank_"
    own = (open_base / f"77.{OTHER_UID}").stat()
    assert (own.st_uid, own.st_mode & 0o777) == (OTHER_UID, 0o700)
    assert list((open_base / "77").iterdir()) == []
    for name in ("78", f"78.{OTHER_UID}"):
        (open_base / name).mkdir()
        os.chown(open_base / name, SQUATTER_UID, SQUATTER_UID)
    done = _taskprolog(open_base, "78")
    assert done.stdout == (
        "print cluster-accept watch: not armed: no directory of this user for the job in "
        f"{open_base} (it must be root's, mode 1777)\n"
    )


# The Inspector's and RAS's readers ----------------------------------------------------------------------------


@pytest.mark.integration
def test_the_inspector_reader_refuses_a_fifo_and_a_link_and_reads_the_other_files(tmp_path: Path) -> None:
    directory = tmp_path / "inspector"
    shutil.copytree(DATA / "inspector", directory)
    (directory / "gpu-node-07-pid1.log").symlink_to("/dev/zero")
    os.mkfifo(directory / "gpu-node-07-pid2.log")
    try:
        done = subprocess.run(
            [sys.executable, str(NODE / "inspector_read.py"), str(directory)],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the Inspector's reader did not return within 20 s")
    summary = json.loads(done.stdout.splitlines()[-1])
    assert (summary["files"], summary["records"]) == (4, 7)
    assert summary["refused"] == [
        {"file": "gpu-node-07-pid1.log", "detail": "a link: not read"},
        {"file": "gpu-node-07-pid2.log", "detail": "not a regular file: not read"},
    ]


def test_the_ras_reader_stops_a_report_that_never_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    ras_read = _load(NODE / "ras_read.py")
    monkeypatch.setattr(ras_read, "CONNECT_TIMEOUT_S", 0.1)
    monkeypatch.setattr(ras_read, "EXTRA_TIMEOUT_S", 0.1)
    ours, theirs = socket.socketpair()

    def drip() -> None:  # a byte every 50 ms for 8 s, each well inside the socket's timeout
        theirs.sendall(b"SERVER PROTOCOL 2\nOK\nOK\n")
        with theirs, contextlib.suppress(OSError):  # until the reader hangs up
            for _ in range(160):
                time.sleep(0.05)
                theirs.sendall(b"x")

    feeder = threading.Thread(target=drip, daemon=True)
    feeder.start()
    began = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            ras_read.converse(ours, 1, True, verbose=False)
        assert time.monotonic() - began < 4
    finally:
        ours.close()
        feeder.join(timeout=15)


@pytest.mark.integration
def test_the_ras_reader_asks_nothing_of_another_users_listener() -> None:
    ras_read = _load(NODE / "ras_read.py")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        answer = ras_read.read_status("127.0.0.1", port, 1, True, False, uid=OTHER_UID)
        conn, _ = server.accept()
        conn.settimeout(1.0)
        with conn:
            sent = conn.recv(4096)
    finally:
        server.close()
    assert answer == {
        "ras": "unavailable",
        "detail": f"127.0.0.1:{port} is uid 0's, not the job's user {OTHER_UID}: not asked",
    }
    assert sent == b""
