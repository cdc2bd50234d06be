"""The nccl_env check: the real env capture, NCCL's precedence (env > user file > /etc/nccl.conf), profile
misses, drift against the cluster (values and presence), secret masking, and broken outputs."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

import cluster_accept.checks.nccl_env as nccl_env
from cluster_accept.checks.base import Status, majority_values
from cluster_accept.checks.nccl_env import Setting
from cluster_accept.inventory.model import Profile
from cluster_accept.testbed.profile import TESTBED_NCCL_ENV
from cluster_accept.vocabulary.secrets import is_secret_name
from tests.boundary import entered
from tests.capture import NO_CLUSTER, captured

TESTBED = Profile(nccl_env=dict(TESTBED_NCCL_ENV))  # NCCL_SOCKET_IFNAME=eth0, NCCL_IB_DISABLE=1, NCCL_NVLS_ENABLE=0


def capture_env(base: str = "h200x4") -> dict[str, str]:
    stdout, code = captured(base, "env-nccl.txt")
    assert code == 0
    return dict(line.split("=", 1) for line in stdout.splitlines())


def output(env: dict[str, str], etc: str = "", user: str = "", conf_file: str | None = None) -> str:
    """What COMMAND prints for a session ``env`` (before the node's grep) and the two config files."""
    env_lines = "".join(f"{k}={v}\n" for k, v in sorted(env.items()) if k.startswith(nccl_env._PREFIXES))
    user_part = f"### NCCL_CONF_FILE\n{conf_file}" if conf_file is not None else f"### ~/.nccl.conf\n{user}"
    return f"### env\n{env_lines}### /etc/nccl.conf\n{etc}{user_part}### end\n"


def rows_of(rows: list) -> list[tuple[str, str, str, str | None, str | None]]:
    return [(r.item, r.status.value, r.reason, r.observed, r.expected) for r in rows]


def run_command(tmp_path: Path, env: dict[str, str], etc: str | None = None, user: str | None = None) -> str:
    """COMMAND through ``sh -c`` with a clean ``env``, HOME in tmp_path and /etc/nccl.conf read from tmp_path."""
    home = tmp_path / "home"
    home.mkdir()
    if user is not None:
        (home / ".nccl.conf").write_text(user)
    etc_file = tmp_path / "etc-nccl.conf"
    if etc is not None:
        etc_file.write_text(etc)
    command = nccl_env.COMMAND.replace("ca_conf /etc/nccl.conf ", f"ca_conf {etc_file} ")
    assert command.count(str(etc_file)) == 1
    proc = subprocess.run(
        ["sh", "-c", command],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), **env},
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("base", ["h200x4", "h100x1"])
def test_capture_environment_exact(base: str) -> None:
    model = nccl_env.parse(output(capture_env(base)), 0)
    assert model.error is None
    assert model.effective == {
        "NCCL_NVLS_ENABLE": Setting("0", "env"),
        "NCCL_VERSION": Setting("2.28.3-1", "env"),
        "NVSHMEM_DISABLE_NVLS": Setting("1", "env"),
    }
    assert nccl_env.cluster_values(model) == {
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_VERSION": "2.28.3-1",
        "nccl_keys": "NCCL_NVLS_ENABLE,NCCL_VERSION",
    }
    assert rows_of(nccl_env.evaluate(model, TESTBED, NO_CLUSTER)) == [
        ("NCCL_SOCKET_IFNAME", "fail", "missing", None, "eth0"),
        ("NCCL_IB_DISABLE", "fail", "missing", None, "1"),
        ("NCCL_NVLS_ENABLE", "pass", "ok", "0", "0"),
    ]
    assert nccl_env.evaluate(model, TESTBED, NO_CLUSTER)[2].detail == "from env"


@pytest.mark.integration
def test_testbed_node_as_sshd_serves_it(tmp_path: Path) -> None:
    """The test-bed's node: capture env + the profile's settings through SetEnv, the same in /etc/nccl.conf."""
    env = {**capture_env(), **TESTBED_NCCL_ENV}
    etc = "".join(f"{k}={v}\n" for k, v in TESTBED_NCCL_ENV.items())
    stdout = run_command(tmp_path, env, etc=etc)
    env_part, sep, rest = stdout.partition("### /etc/nccl.conf\n")
    assert sep and rest == etc + "### ~/.nccl.conf\n### end\n"
    assert env_part.startswith("### env\n")
    assert sorted(env_part.splitlines()[1:]) == [  # env prints in its own order; CUDA_*, TORCH_* filtered out
        "NCCL_IB_DISABLE=1",
        "NCCL_NVLS_ENABLE=0",
        "NCCL_SOCKET_IFNAME=eth0",
        "NCCL_VERSION=2.28.3-1",
        "NVSHMEM_DISABLE_NVLS=1",
    ]
    model = nccl_env.parse(stdout, 0)
    rows = nccl_env.evaluate(model, TESTBED, NO_CLUSTER)
    assert rows_of(rows) == [
        ("NCCL_SOCKET_IFNAME", "pass", "ok", "eth0", "eth0"),
        ("NCCL_IB_DISABLE", "pass", "ok", "1", "1"),
        ("NCCL_NVLS_ENABLE", "pass", "ok", "0", "0"),
    ]
    assert rows[0].detail == "from env; overrides /etc/nccl.conf: 'eth0'"


def test_missing_and_different_with_the_source_in_detail() -> None:
    env = {**capture_env(), "NCCL_SOCKET_IFNAME": "eth9", "NCCL_NVLS_ENABLE": "0"}
    etc = "NCCL_SOCKET_IFNAME=eth0\nNCCL_NVLS_ENABLE=0\n"  # NCCL_IB_DISABLE removed everywhere
    rows = nccl_env.evaluate(nccl_env.parse(output(env, etc=etc), 0), TESTBED, NO_CLUSTER)
    assert rows_of(rows) == [
        ("NCCL_SOCKET_IFNAME", "fail", "value_mismatch", "eth9", "eth0"),
        ("NCCL_IB_DISABLE", "fail", "missing", None, "1"),
        ("NCCL_NVLS_ENABLE", "pass", "ok", "0", "0"),
    ]
    assert rows[0].detail == "from env; overrides /etc/nccl.conf: 'eth0'"
    assert rows[1].detail == "not set in the environment, ~/.nccl.conf or /etc/nccl.conf"
    only_etc = nccl_env.evaluate(nccl_env.parse(output({}, etc="NCCL_IB_DISABLE=0\n"), 0), TESTBED, NO_CLUSTER)
    assert rows_of(only_etc)[1] == ("NCCL_IB_DISABLE", "fail", "value_mismatch", "0", "1")
    assert only_etc[1].detail == "from /etc/nccl.conf"


@pytest.mark.integration
def test_precedence_env_over_user_file_over_etc(tmp_path: Path) -> None:
    user = "# a comment line\n#NCCL_ALGO=Tree\nNCCL_DEBUG=WARN\nNCCL_DEBUG=TRACE\nNCCL_PROTO=Simple\r\nNCCL_NET=IB"
    etc = "NCCL_DEBUG=INFO\nNCCL_PROTO=LL\nNCCL_ALGO=Ring\nNCCL_SOCKET_IFNAME=eth1\nnot a setting\nFOO=bar\n"
    stdout = run_command(tmp_path, {"NCCL_SOCKET_IFNAME": "eth0", "HOSTNAME": "n1"}, etc=etc, user=user)
    model = nccl_env.parse(stdout, 0)
    assert model.effective == {
        "NCCL_ALGO": Setting("Ring", "/etc/nccl.conf"),
        "NCCL_DEBUG": Setting("WARN", "~/.nccl.conf", (("/etc/nccl.conf", "INFO"),)),  # first line of a file wins
        "NCCL_NET": Setting("IB", "~/.nccl.conf"),  # last line without a newline
        "NCCL_PROTO": Setting("Simple", "~/.nccl.conf", (("/etc/nccl.conf", "LL"),)),  # CR dropped
        "NCCL_SOCKET_IFNAME": Setting("eth0", "env", (("/etc/nccl.conf", "eth1"),)),
    }
    profile = Profile(nccl_env={"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Ring"})
    rows = nccl_env.evaluate(model, profile, NO_CLUSTER)
    assert rows_of(rows) == [
        ("NCCL_DEBUG", "fail", "value_mismatch", "WARN", "INFO"),
        ("NCCL_ALGO", "pass", "ok", "Ring", "Ring"),
    ]
    assert rows[0].detail == "from ~/.nccl.conf; overrides /etc/nccl.conf: 'INFO'"


@pytest.mark.integration
def test_nccl_conf_file_replaces_the_home_file(tmp_path: Path) -> None:
    conf = tmp_path / "job.conf"
    conf.write_text("NCCL_DEBUG=VERSION\n")
    stdout = run_command(tmp_path, {"NCCL_CONF_FILE": str(conf)}, etc="NCCL_DEBUG=INFO\n", user="NCCL_DEBUG=WARN\n")
    model = nccl_env.parse(stdout, 0)
    source = f"NCCL_CONF_FILE ({conf})"
    assert model.effective["NCCL_DEBUG"] == Setting("VERSION", source, (("/etc/nccl.conf", "INFO"),))


def test_conf_line_with_spaces_around_the_key_is_flagged() -> None:
    model = nccl_env.parse(output({}, etc="NCCL_DEBUG = INFO\n NCCL_ALGO=Ring\n"), 0)
    assert model.effective == {}
    rows = nccl_env.evaluate(model, Profile(nccl_env={"NCCL_DEBUG": "INFO"}), NO_CLUSTER)
    assert rows_of(rows) == [
        ("NCCL_DEBUG", "fail", "missing", None, "INFO"),
        ("NCCL_DEBUG", "warn", "conf_line_ignored", "NCCL_DEBUG = INFO", "NCCL_DEBUG=<value>"),
        ("NCCL_ALGO", "warn", "conf_line_ignored", " NCCL_ALGO=Ring", "NCCL_ALGO=<value>"),
    ]
    assert rows[1].detail.startswith("/etc/nccl.conf: ")


def test_key_outside_the_collected_prefixes_is_not_judged() -> None:
    model = nccl_env.parse(output({"NCCL_DEBUG": "INFO"}), 0)
    rows = nccl_env.evaluate(model, Profile(nccl_env={"OMPI_MCA_btl": "^openib"}), NO_CLUSTER)
    assert rows_of(rows) == [("OMPI_MCA_btl", "skip", "not_collected", None, "^openib")]


@pytest.mark.integration
def test_secrets_are_masked_on_the_node(tmp_path: Path) -> None:
    env = {
        "NCCL_IB_TOKEN": "tok-123",
        "NCCL_SECRET_KEY": "s3cr3t",
        "NCCL_IB_PKEY": "0x8001",
        "HF_TOKEN": "hf_abc",
        "NCCL_DEBUG_SUBSYS": "INIT,ENV  \"quoted\" 'single' back\\slash $HOME",
    }
    user = "#NCCL_API_TOKEN=old-token\nUCX_PASSWORD=pw-456\n"
    stdout = run_command(tmp_path, env, user=user)
    for secret in ("tok-123", "s3cr3t", "hf_abc", "old-token", "pw-456"):
        assert secret not in stdout
    assert "NCCL_IB_TOKEN=****\n" in stdout and "#NCCL_API_TOKEN=****\n" in stdout
    model = nccl_env.parse(stdout, 0)
    assert model.effective == {
        "NCCL_DEBUG_SUBSYS": Setting("INIT,ENV  \"quoted\" 'single' back\\slash $HOME", "env"),
        "NCCL_IB_PKEY": Setting("0x8001", "env"),
        "NCCL_IB_TOKEN": Setting("****", "env"),
        "NCCL_SECRET_KEY": Setting("****", "env"),
        "UCX_PASSWORD": Setting("****", "~/.nccl.conf"),
    }


def test_secrets_are_masked_by_the_parser_too() -> None:
    stdout = output({"NCCL_IB_TOKEN": "tok-123", "NCCL_IB_PKEY": "0x8001"}, etc="NCCL_IB_TOKEN=etc-tok\n")
    model = nccl_env.parse(stdout, 0)
    assert "tok-123" not in model.raw and "etc-tok" not in model.raw and "0x8001" in model.raw
    assert model.effective["NCCL_IB_TOKEN"] == Setting("****", "env", (("/etc/nccl.conf", "****"),))
    profile = Profile(nccl_env={"NCCL_IB_TOKEN": "tok-123", "NCCL_IB_PKEY": "0x8001", "NCCL_NET_KEY": "k-9"})
    rows = nccl_env.evaluate(model, profile, NO_CLUSTER)
    assert rows_of(rows) == [
        ("NCCL_IB_TOKEN", "skip", "secret_not_compared", "****", "****"),
        ("NCCL_IB_PKEY", "pass", "ok", "0x8001", "0x8001"),
        ("NCCL_NET_KEY", "fail", "missing", None, "****"),
    ]
    assert all("tok-123" not in r.detail and "k-9" not in r.detail for r in rows)
    broken = nccl_env.parse("NCCL_IB_TOKEN=tok-123\n### env\n", 0)
    assert broken.error is not None and "tok-123" not in broken.error + broken.raw
    assert "tok-123" not in nccl_env.evaluate(broken, profile, NO_CLUSTER)[0].detail
    assert nccl_env.cluster_values(model)["NCCL_IB_TOKEN"] == "****"


def _node(env: dict[str, str]) -> nccl_env.NcclEnv:
    return nccl_env.parse(output(env), 0)


def test_drift_of_values_and_of_presence_against_the_majority() -> None:
    common = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN", "NCCL_ALGO": "Ring", "UCX_TLS": "rc"}
    nodes = {
        "a": _node(common),
        "b": _node(common),
        "c": _node(common),
        "odd_value": _node({**common, "NCCL_DEBUG": "INFO", "UCX_TLS": "tcp"}),
        "extra": _node({**common, "NCCL_P2P_LEVEL": "NVL"}),
        "lacking": _node({k: v for k, v in common.items() if k != "NCCL_ALGO"}),
    }
    view = majority_values({name: nccl_env.cluster_values(m) for name, m in nodes.items()})
    assert view.majority_of("nccl_keys") == "NCCL_ALGO,NCCL_DEBUG,NCCL_SOCKET_IFNAME"
    assert view.majority_of("NCCL_P2P_LEVEL") == "NVL"  # its only reporter: presence needs the key set
    profile = Profile(nccl_env={"NCCL_SOCKET_IFNAME": "eth0"})
    judged = {name: rows_of(nccl_env.evaluate(m, profile, view)) for name, m in nodes.items()}
    ok = ("NCCL_SOCKET_IFNAME", "pass", "ok", "eth0", "eth0")
    assert judged["a"] == [ok]
    assert judged["odd_value"] == [ok, ("NCCL_DEBUG", "warn", "drift", "INFO", "WARN (majority)")]
    assert judged["extra"] == [ok, ("NCCL_P2P_LEVEL", "warn", "drift", "NVL", "<unset> (majority)")]
    assert judged["lacking"] == [ok, ("NCCL_ALGO", "warn", "drift", "<unset>", "Ring (majority)")]
    extra_row = nccl_env.evaluate(nodes["extra"], profile, view)[1]
    assert extra_row.detail == "from env"


def test_pinned_keys_are_judged_by_the_profile_not_by_drift() -> None:
    nodes = {n: _node({"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}) for n in ("a", "b", "c")}
    nodes["d"] = _node({"NCCL_SOCKET_IFNAME": "eth9"})
    view = majority_values({name: nccl_env.cluster_values(m) for name, m in nodes.items()})
    profile = Profile(nccl_env={"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"})
    assert rows_of(nccl_env.evaluate(nodes["d"], profile, view)) == [
        ("NCCL_SOCKET_IFNAME", "fail", "value_mismatch", "eth9", "eth0"),
        ("NCCL_IB_DISABLE", "fail", "missing", None, "1"),
    ]
    # Unpinned, the same node drifts on both keys.
    assert rows_of(nccl_env.evaluate(nodes["d"], Profile(), view)) == [
        ("NCCL_IB_DISABLE", "warn", "drift", "<unset>", "1 (majority)"),
        ("NCCL_SOCKET_IFNAME", "warn", "drift", "eth9", "eth0 (majority)"),
    ]


def test_no_majority_key_set_judges_values_only() -> None:
    nodes = {
        "a": _node({"NCCL_DEBUG": "WARN"}),
        "b": _node({"NCCL_DEBUG": "WARN", "NCCL_ALGO": "Ring"}),
        "c": _node({"NCCL_DEBUG": "INFO", "NCCL_PROTO": "LL"}),
    }
    view = majority_values({name: nccl_env.cluster_values(m) for name, m in nodes.items()})
    assert view.majority_of("nccl_keys") is None
    assert rows_of(nccl_env.evaluate(nodes["c"], Profile(), view)) == [
        ("NCCL_DEBUG", "warn", "drift", "INFO", "WARN (majority)")
    ]
    assert rows_of(nccl_env.evaluate(nodes["a"], Profile(), view)) == []


def test_node_without_nccl_keys_votes_for_an_empty_set() -> None:
    nodes = {n: _node({}) for n in ("a", "b")}
    nodes["c"] = _node({"NCCL_DEBUG": "INFO"})
    assert nccl_env.cluster_values(nodes["a"]) == {"nccl_keys": ""}
    view = majority_values({name: nccl_env.cluster_values(m) for name, m in nodes.items()})
    assert rows_of(nccl_env.evaluate(nodes["c"], Profile(), view)) == [
        ("NCCL_DEBUG", "warn", "drift", "INFO", "<unset> (majority)")
    ]
    assert rows_of(nccl_env.evaluate(nodes["a"], Profile(), view)) == []


GOOD = output({"NCCL_DEBUG": "INFO"}, etc="NCCL_ALGO=Ring\n")


@pytest.mark.parametrize(
    "stdout",
    [
        "",
        "\x00\x7f#!garbage ~~~ 42\n",
        GOOD[: GOOD.index("### end")],  # truncated before the end marker
        GOOD[:20],
        "NCCL_DEBUG=INFO\n",
        "### /etc/nccl.conf\nNCCL_DEBUG=INFO\n### end\n",  # no env section
    ],
)
def test_garbage_and_truncated_output_are_error_rows(stdout: str) -> None:
    model = nccl_env.parse(stdout, 0)
    assert model.error is not None and model.effective == {}
    assert nccl_env.cluster_values(model) == {}
    rows = nccl_env.evaluate(model, TESTBED, NO_CLUSTER)
    assert [(r.item, r.status, r.reason) for r in rows] == [("output", Status.ERROR, "unparsable_output")]
    assert stdout[:10] in rows[0].detail


def test_good_output_parses() -> None:
    model = nccl_env.parse(GOOD, 0)
    assert model.error is None
    assert model.effective == {"NCCL_ALGO": Setting("Ring", "/etc/nccl.conf"), "NCCL_DEBUG": Setting("INFO", "env")}


SECRET_NAMES = (
    "NCCL_PASSWD NCCL_PASS PASS DB_PASS MYSQL_PWD NCCL_IB_AUTH Authorization GITHUB_PAT NCCL_COOKIE "
    "SSH_KEY_PASSPHRASE AWS_CREDENTIALS APIKEY API_KEYS NCCL_TOKENS hf_token #NCCL_OLD_SECRET"
).split() + ["NCCL_API_KEY "]
PLAIN_NAMES = (
    "PWD OLDPWD AUTHOR PATH PATTERN BYPASS SESSION XDG_SESSION_ID KEYBOARD TOKENIZERS_PARALLELISM NCCL_IB_PKEY "
    "UCX_IB_PKEY NCCL_SOCKET_IFNAME"
).split()


@pytest.mark.integration
def test_the_node_masks_by_the_same_name_rule_as_the_controller(tmp_path: Path) -> None:
    """The awk that runs on the node, through sh, against ``analysis.secrets.is_secret_name``."""
    names = SECRET_NAMES + PLAIN_NAMES
    stdout = run_command(tmp_path, {}, user="".join(f"{name}=v4lue-{i}\n" for i, name in enumerate(names)))
    lines = stdout.split("### ~/.nccl.conf\n", 1)[1].split("### end\n", 1)[0].splitlines()
    masked = {line.partition("=")[0] for line in lines if line.partition("=")[2] == nccl_env.MASK}
    assert len(lines) == len(names) and masked == set(SECRET_NAMES)
    assert masked == {name for name in names if is_secret_name(name)}


@pytest.mark.integration
def test_secrets_by_shape_reach_the_parser_masked(tmp_path: Path) -> None:
    token = "ghp_" + "S3KR1T" + "a" * 30
    env = {"NCCL_DB_URL": "postgres://svc:S3KR1T@db/jobs", "NCCL_NOTE": f"via {token}", "NCCL_DEBUG": "WARN"}
    conf_file = tmp_path / "nccl.conf"
    conf_file.write_text(
        "NCCL_ALGO=Ring\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlS3KR1T\n-----END OPENSSH PRIVATE KEY-----\n"
    )
    stdout = run_command(tmp_path, {**env, "NCCL_CONF_FILE": str(conf_file)})
    model = nccl_env.parse(entered(stdout), 0)  # as the node's output entered the controller: masked there
    assert "S3KR1T" not in model.raw + repr(model.effective) + repr(nccl_env.cluster_values(model))
    assert model.effective["NCCL_DB_URL"].value == "postgres://svc:***@db/jobs"
    assert model.effective["NCCL_NOTE"].value == "via ghp_***"
    assert "-----BEGIN OPENSSH PRIVATE KEY-----\n***\n-----END OPENSSH PRIVATE KEY-----" in model.raw
    # A pinned value is compared in its masked form: the same URL passes, another host does not.
    profile = Profile(nccl_env={"NCCL_DB_URL": "postgres://svc:S3KR1T@db/jobs", "NCCL_NOTE": "via ghp_other"})
    rows = nccl_env.evaluate(model, profile, NO_CLUSTER)
    assert [(r.item, r.reason) for r in rows] == [("NCCL_DB_URL", "ok"), ("NCCL_NOTE", "value_mismatch")]


def _limited() -> None:
    """A gigabyte of address space: an unbounded read of /dev/zero ends in an error, not in the machine's memory."""
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def _hostile_run(tmp_path: Path, make_user_file: str, conf_file: bool = False) -> tuple[str, float]:
    """COMMAND with ``~/.nccl.conf`` (or ``$NCCL_CONF_FILE``) made hostile by ``make_user_file``: the output and
    the seconds it took, under a memory cap and a timeout well above the reader's own bound."""
    home = tmp_path / "home"
    home.mkdir()
    target = home / ".nccl.conf"
    if make_user_file == "dev_zero":
        target.symlink_to("/dev/zero")
    elif make_user_file == "fifo":
        os.mkfifo(target)
    elif make_user_file == "other_user":
        target.write_text("NCCL_P2P_DISABLE=1\n")
        os.chown(target, 65534, 65534)
    elif make_user_file == "long":
        target.write_text("NCCL_DEBUG=WARN\n" + "#" * 200_000 + "\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    if conf_file:
        env["NCCL_CONF_FILE"] = str(target)
    command = nccl_env.COMMAND.replace("ca_conf /etc/nccl.conf ", "ca_conf /nonexistent/nccl.conf ")
    started = time.monotonic()
    proc = subprocess.Popen(
        ["sh", "-c", command], stdout=subprocess.PIPE, text=True, env=env, preexec_fn=_limited, start_new_session=True
    )
    try:
        stdout, _ = proc.communicate(timeout=20)
    finally:  # a reader that waits or reads without end is stopped with every process of its pipeline
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return stdout, time.monotonic() - started


@pytest.mark.integration
@pytest.mark.parametrize(
    ("hostile", "conf_file", "why"),
    [
        ("dev_zero", False, "a link: not followed"),
        ("dev_zero", True, "a link: not followed"),
        ("fifo", False, "not a regular file"),
        ("other_user", True, "owned by uid 65534, neither the reading user nor root"),
    ],
)
def test_a_job_users_hostile_conf_file_is_named_never_followed_read_or_waited_on(
    tmp_path: Path, hostile: str, conf_file: bool, why: str
) -> None:
    stdout, seconds = _hostile_run(tmp_path, hostile, conf_file)
    assert seconds < 5, "the reader waited on a file a job's user controls"
    model = nccl_env.parse(stdout, 0)
    source = f"NCCL_CONF_FILE ({tmp_path / 'home' / '.nccl.conf'})" if conf_file else "~/.nccl.conf"
    assert model.error is None and model.refused == [(source, why)]
    assert "NCCL_P2P_DISABLE" not in model.effective  # another user's file sets nothing this check believes
    rows = nccl_env.evaluate(model, Profile(), NO_CLUSTER)
    assert rows_of(rows) == [(source, "warn", "conf_unread", why, "a regular file")]


@pytest.mark.integration
def test_a_long_conf_file_is_read_to_its_bound_and_said_so(tmp_path: Path) -> None:
    stdout, _ = _hostile_run(tmp_path, "long")
    model = nccl_env.parse(stdout, 0)
    assert model.effective["NCCL_DEBUG"] == Setting("WARN", "~/.nccl.conf")
    assert model.refused == [("~/.nccl.conf", "longer than 65536 bytes: read to there")]
