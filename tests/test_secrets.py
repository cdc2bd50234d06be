"""Secret-looking values are masked where node output enters the controller (``vocabulary.secrets``), so that
none reaches a stored row."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cluster_accept.checks import nccl_env
from cluster_accept.checks.base import CheckRow, Status, discover, error_row
from cluster_accept.inventory.model import DEFAULT_SSH, Inventory, Node, Profile
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus, RemoteCommand
from cluster_accept.remote.shell import ShellSession
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.tasks import probe_runs
from cluster_accept.tasks.preflight.check_batch import NodePreflight
from cluster_accept.tasks.preflight.stage import evaluate_preflight, node_values
from cluster_accept.tasks.rows import RAW_OUTPUT_LIMIT, node_row
from cluster_accept.vocabulary.secrets import is_secret_name, mask_secrets, mask_value
from cluster_accept.vocabulary.text import keep_head
from tests.boundary import entered


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NCCL_IB_SECRET_TOKEN=hunter2", "NCCL_IB_SECRET_TOKEN=***"),
        ("NCCL_PASSWORD = hunter2 pw", "NCCL_PASSWORD = ***"),
        ("export HF_TOKEN=hf_abc", "export HF_TOKEN=***"),
        ("api_key: abc123", "api_key: ***"),
        ("aws_secret_access_key:abc", "aws_secret_access_key:***"),
        ("db_Password='p w'", "db_Password=***"),
        ("--api-key=abc", "--api-key=***"),
        ('{"api_key": "abc", "n": 1}', '{"api_key": ***'),
        ("NCCL_DEBUG=INFO NCCL_TOKEN=abc", "NCCL_DEBUG=INFO NCCL_TOKEN=***"),
        (
            "#NCCL_API_TOKEN=old\r\nUCX_PASSWORD=pw-456\nNCCL_IB_PKEY=0x8001\nNCCL_IB_HCA=mlx5_0\n",
            "#NCCL_API_TOKEN=***\r\nUCX_PASSWORD=***\nNCCL_IB_PKEY=0x8001\nNCCL_IB_HCA=mlx5_0\n",
        ),
        ("[stderr]\nexport GH_TOKEN=ghp_1 && run", "[stderr]\nexport GH_TOKEN=***"),
    ],
)
def test_secret_values_are_masked_and_names_kept(text: str, expected: str) -> None:
    assert mask_secrets(text) == expected
    assert mask_secrets(expected) == expected  # masking twice changes nothing


@pytest.mark.parametrize(
    "text",
    [
        "NCCL_IB_PKEY=0",  # a partition key index, not a secret
        "NCCL_SOCKET_IFNAME=eth0",
        "NCCL_DEBUG_SUBSYS=KEY,TOKEN",  # KEY in the value, not in the name
        "note: the KEY is here",
        "ssh: unknown host key under 'strict' policy: Server '10.0.0.1' not found in known_hosts",
        "NCCL_IB_TOKEN=****",  # already masked by the check: left as it is
        "NCCL_IB_TOKEN=",  # nothing to hide
        "NCCL_PASSWORD=<value>",  # a placeholder, not a value
        "Persistence Mode                      : Enabled",
        "",
    ],
)
def test_what_is_not_a_secret_is_left_alone(text: str) -> None:
    assert mask_secrets(text) == text


def test_mask_value_judges_by_the_name_beside_it() -> None:
    assert mask_value("NCCL_IB_SECRET_TOKEN", "hunter2") == "***"
    assert mask_value("NCCL_IB_PKEY", "0x8001") == "0x8001"
    assert mask_value("NCCL_SOCKET_IFNAME", "eth0") == "eth0"
    assert mask_value("NCCL_PASSWORD", "****") == "****"
    assert mask_value("nccl_keys", "NCCL_DEBUG,NCCL_PASSWORD") == "NCCL_DEBUG,NCCL_PASSWORD"
    assert mask_value("detail", "NCCL_PASSWORD=pw") == "NCCL_PASSWORD=***"
    assert mask_value("NCCL_PASSWORD", "user:pw==") == "***"  # a bare value, whatever it looks like
    assert mask_value("NCCL_PASSWORD", "NCCL_PASSWORD =pw") == "NCCL_PASSWORD =***"  # its own line keeps the name
    assert mask_value("NCCL_PASSWORD", "<unset> (majority)") == "<unset> (majority)"


def test_long_hostile_output_is_masked_in_linear_time() -> None:
    text = "a: " * 30_000 + "\n" + "B_KEY=x " * 10_000
    assert mask_secrets(text) == "a: " * 30_000 + "\nB_KEY=***"


def test_a_secret_items_values_reach_its_row_masked() -> None:
    """A variable of a secret name, set in the environment and both files (the node's awk switched off): its
    values are masked where the output entered the controller, so the row the check writes of them holds none."""
    stdout = (
        "### env\nNCCL_PASSWORD=hunter2-env\n### /etc/nccl.conf\nNCCL_PASSWORD=hunter2-etc\n"
        "### ~/.nccl.conf\nNCCL_PASSWORD=****\n### end\n"
    )
    setting = nccl_env.parse(entered(stdout), 0).effective["NCCL_PASSWORD"]
    detail = nccl_env._where(setting)
    row = CheckRow("nccl_env", "NCCL_PASSWORD", Status.WARN, "drift", setting.value, "<unset> (majority)", detail)
    stored = node_row("r", "c", "preflight", "node01", row, entered(stdout))
    assert (stored.observed, stored.expected) == ("****", "<unset> (majority)")
    assert stored.detail == "from env; overrides ~/.nccl.conf: '****', /etc/nccl.conf: '****'"
    assert "hunter2" not in repr(stored)
    plain = CheckRow("nccl_env", "NCCL_SOCKET_IFNAME", Status.FAIL, "value_mismatch", "eth9", "eth0", "from 'env'")
    stored = node_row("r", "c", "preflight", "node01", plain, "")
    assert (stored.observed, stored.expected, stored.detail) == ("eth9", "eth0", "from 'env'")


def test_a_row_holds_node_text_masked_but_not_the_command() -> None:
    """Node text in a row is as it entered the controller (masked there); the command is the controller's own."""
    observed, detail = entered("NCCL_PASSWORD=pw1"), entered("api_key: pw2")
    row = CheckRow("nccl_env", "NCCL_PASSWORD", Status.WARN, "drift", observed, None, detail)
    raw = entered("NCCL_PASSWORD=pw3\nNCCL_IB_PKEY=0\n")
    stored = node_row("r", "c", "preflight", "node01", row, raw, "env | grep KEY=")
    assert (stored.observed, stored.expected, stored.detail) == ("NCCL_PASSWORD=***", None, "api_key: ***")
    assert stored.raw_output == "NCCL_PASSWORD=***\nNCCL_IB_PKEY=0\n"
    assert stored.command == "env | grep KEY="
    assert (stored.item, stored.reason) == ("NCCL_PASSWORD", "drift")


def test_stored_rows_hold_no_secret_even_when_the_check_does_not_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """The boundary alone: nccl_env's own masking switched off, a node whose output is not masked (its awk off):
    the output masked where it entered the controller holds no secret in any row or value; the profile's pinned
    value, the inventory's text, is masked by the vocabulary's rule where the check writes it."""
    monkeypatch.setattr(nccl_env, "is_secret", lambda key: False)
    check = next(c for c in discover() if c.name == "nccl_env")
    secret = (
        "### env\nNCCL_PASSWORD=hunter2-env\nNCCL_IB_SECRET_TOKEN=hunter2-token\nNCCL_IB_PKEY=0\n"
        "### /etc/nccl.conf\nNCCL_PASSWORD=hunter2-etc\nNCCL_API_KEY =hunter2-spaced\n### ~/.nccl.conf\n### end\n"
    )
    plain = "### env\nNCCL_IB_PKEY=0\n### /etc/nccl.conf\n### ~/.nccl.conf\n### end\n"
    profile = Profile(nccl_env={"NCCL_PASSWORD": "hunter2-pinned"})
    nodes = [Node(f"node0{i}", DEFAULT_SSH, "p", profile) for i in (1, 2, 3)]
    outcomes = []
    for node, printed in zip(nodes, (secret, plain, plain), strict=True):
        stdout = entered(printed)
        result = NodeResult(node.name, NodeStatus.OK, commands=[CommandResult("nccl_env", 0, stdout, "")])
        outcomes.append(NodePreflight(node.name, result, {"nccl_env": check.parse(stdout, 0)}))
    inventory = Inventory("c", nodes, {"p": profile}, "inventory.yaml", "digest")

    rows = evaluate_preflight("r", inventory, outcomes, [check])
    values = node_values("r", "c", outcomes, [check])

    assert "hunter2" not in repr(rows) + repr(values)
    mine = {(r.item, r.reason): (r.observed, r.expected) for r in rows if r.node == "node01"}
    assert mine[("NCCL_PASSWORD", "value_mismatch")] == ("***", "***")
    assert mine[("NCCL_IB_SECRET_TOKEN", "drift")] == ("***", "<unset> (majority)")
    assert mine[("NCCL_API_KEY", "conf_line_ignored")] == ("NCCL_API_KEY =***", "NCCL_API_KEY=<value>")
    assert "NCCL_IB_SECRET_TOKEN=***\nNCCL_IB_PKEY=0\n" in rows[0].raw_output
    stored = [v.record() for v in values]  # the rows as node_values.parquet holds them
    assert "hunter2" not in repr(stored)
    assert {(v["key"], v["value"]) for v in stored if v["node"] == "node01"} >= {
        ("NCCL_PASSWORD", "***"),
        ("NCCL_IB_SECRET_TOKEN", "***"),
        ("NCCL_IB_PKEY", "0"),
    }


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_PASSWD",
        "PASSWD",
        "PASS",
        "DB_PASS",
        "MYSQL_PWD",
        "SSH_KEY_PASSPHRASE",
        "AWS_CREDENTIALS",
        "credential",
        "AUTH",
        "BASIC_AUTH",
        "Authorization",
        "X-Auth-Token",
        "GITHUB_PAT",
        "GH_PAT_2",
        "COOKIE",
        "Set-Cookie",
        "API_KEYS",
        "APIKEY",
        "NCCL_TOKENS",
        "SESSION_TOKEN",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)
    assert mask_secrets(f"{name}=s3kr1t-value") == f"{name}=***"


@pytest.mark.parametrize(
    "name",
    [
        "PWD",  # the working directory
        "OLDPWD",
        "PATH",
        "BYPASS",
        "PATTERN",
        "KEYBOARD",
        "KEYMAP",
        "TOKENIZERS_PARALLELISM",
        "AUTHOR",
        "SESSION",  # a session's id or type; its token or key is caught by TOKEN or KEY
        "XDG_SESSION_ID",
        "NCCL_IB_PKEY",  # an InfiniBand partition key index
        "UCX_IB_PKEY",
        "nccl_keys",
        "NCCL_SOCKET_IFNAME",
    ],
)
def test_names_that_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)
    assert mask_secrets(f"{name}=/home/x") == f"{name}=/home/x"


GH = "ghp_" + "S3KR1Tgithub" + "0" * 24
HF = "hf_" + "S3KR1Thugging" + "a" * 21
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJTM0tSMVQifQ.S3KR1Tsig_dozjgNryP4J3jVmNHl0w5N"
KEY_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQS3KR1T\nAAAAC3NzaC1lZDI1NTE5AAAAIS3KR1T==\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a URL's password, whatever the name, wherever it is
        ("DATABASE_URL=postgres://user:S3KR1T@db/jobs", "DATABASE_URL=postgres://user:***@db/jobs"),
        (
            "pulling https://bot:S3KR1T@registry.example/v2 (retry 2)",
            "pulling https://bot:***@registry.example/v2 (retry 2)",
        ),
        ("redis://:S3KR1T@cache:6379/0", "redis://:***@cache:6379/0"),
        ("'https://u:p@S3KR1T@host/x'", "'https://u:***@host/x'"),  # an unencoded '@' in the password
        ("https://x-access-token:S3KR1T@github.com/o/r", "https://x-access-token:***@github.com/o/r"),
        # tokens with a well-known prefix, the prefix kept
        (f"NCCL_IB_HCA={GH}", "NCCL_IB_HCA=ghp_***"),
        (f"clone https://{GH}@github.com/o/r", "clone https://ghp_***@github.com/o/r"),
        ("gho_S3KR1T" + "b" * 30 + " ghu_S3KR1T" + "c" * 30, "gho_*** ghu_***"),
        ("ghs_S3KR1T" + "d" * 30 + ",ghr_S3KR1T" + "e" * 30, "ghs_***,ghr_***"),
        ("github_pat_11S3KR1T0123456789_abcdefghijklmnopqrstuvwxyz0123456789", "github_pat_***"),
        ("glpat-S3KR1Tgitlab012345678", "glpat-***"),
        ("slack xoxb-123456789012-1234567890123-S3KR1TslackAbc end", "slack xoxb-*** end"),
        (
            "xoxp-1-S3KR1T2345 xoxa-2-S3KR1T2345 xoxr-3-S3KR1T2345 xoxs-4-S3KR1T2345",
            "xoxp-*** xoxa-*** xoxr-*** xoxs-***",
        ),
        ("id AKIAS3KR1TAWS0000007 and ASIAS3KR1TAWS0000008.", "id AKIA*** and ASIA***."),
        (f"[{HF}]", "[hf_***]"),
        ("key sk-proj-S3KR1Topenai0123456789abcdefghijkl_-xyz", "key sk-proj-***"),
        ("sk_live_S3KR1Tstripe0123456789abc rk_live_S3KR1Tstripe0123456789abc", "sk_live_*** rk_live_***"),
        ("npm_S3KR1Tnpm0123456789abcdefghijklmnopq", "npm_***"),
        ("AIzaS3KR1Tgoogle0123456789abcdefghijklm", "AIza***"),
        (f"token {JWT}.", "token eyJ***."),
        # private-key blocks, whole, the markers kept
        (
            f"a\n-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY_BODY}-----END OPENSSH PRIVATE KEY-----\nb",
            "a\n-----BEGIN OPENSSH PRIVATE KEY-----\n***\n-----END OPENSSH PRIVATE KEY-----\nb",
        ),
        (
            "-----BEGIN RSA PRIVATE KEY-----\r\nProc-Type: 4,ENCRYPTED\r\nDEK-Info: AES-128-CBC,S3KR1T\r\n\r\n"
            "MIIS3KR1T\r\n-----END RSA PRIVATE KEY-----\r\n",
            "-----BEGIN RSA PRIVATE KEY-----\n***\n-----END RSA PRIVATE KEY-----\r\n",
        ),
        (
            "-----BEGIN EC PRIVATE KEY-----\nMHcS3KR1T\n-----END EC PRIVATE KEY-----\n"
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIS3KR1T\n-----END ENCRYPTED PRIVATE KEY-----",
            "-----BEGIN EC PRIVATE KEY-----\n***\n-----END EC PRIVATE KEY-----\n"
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\n***\n-----END ENCRYPTED PRIVATE KEY-----",
        ),
        (  # cut off before its END line: masked to the end
            f"key:\n-----BEGIN PRIVATE KEY-----\n{KEY_BODY}",
            "key:\n-----BEGIN PRIVATE KEY-----\n***",
        ),
        (  # its BEGIN line cut off (a tail kept): masked from its first base64 line
            f"[stderr]\n{KEY_BODY}-----END OPENSSH PRIVATE KEY-----\nexit 1",
            "[stderr]\n***\n-----END OPENSSH PRIVATE KEY-----\nexit 1",
        ),
    ],
)
def test_secrets_are_masked_by_shape_whatever_the_name(text: str, expected: str) -> None:
    assert mask_secrets(text) == expected
    assert "S3KR1T" not in mask_secrets(text)
    assert mask_secrets(expected) == expected


@pytest.mark.parametrize(
    "text",
    [
        "NCCL_IB_PKEY=0x8001",
        "PWD=/home/x",
        "KEYBOARD=us",
        "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "GPU-5c4f2c6e-0b7c-3d5e-9a1b-2c3d4e5f6a7b deadbeefcafebabe0123456789abcdef01234567",
        "scikit-learn, task-scheduler-with-a-very-long-hyphenated-name, ask-me-anything-about-disks-and-raid",
        "sk-short sk-only-letters-in-a-long-hyphenated-identifier-here",
        "http://host:8080/path https://example.com/a:b@c git@github.com:org/repo.git ssh://git@host/x",
        "ghp_short hf_short glpat-short xoxb-short AKIA123 AKIAABCDEFGHIJKLMNOPQ eyJhbGciOiJIUzI1NiJ9",
        "hf_hub_download cache_dir=/root/.cache/huggingface task_type: gemm",
        "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"
        "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----",
        "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
    ],
)
def test_what_only_looks_like_a_secret_is_left_alone(text: str) -> None:
    assert mask_secrets(text) == text


def test_every_pattern_is_linear_in_hostile_output() -> None:
    hostile = [
        "sk-" * 30_000,
        "a-" * 50_000,
        "x://a:" * 20_000,
        "://" + "a:" * 50_000,
        "-----END RSA PRIVATE KEY-----\n" * 5_000,
        "-----BEGIN RSA PRIVATE KEY-----" * 5_000,
        "AAAA\n" * 40_000 + "-----END RSA PRIVATE KEY-----",
        ("eyJ" + "a" * 10 + ".") * 20_000,
        "github_pat_" * 10_000,
    ]
    started = time.monotonic()
    for text in hostile:
        mask_secrets(text)
    assert time.monotonic() - started < 10  # linear: well under a second; quadratic: minutes


class _NodeShell(ShellSession):
    """A node's shell that prints ``stdout`` and ``stderr`` for the first command of any batch, framed as
    :func:`remote.batch.build_batch` frames it: the batch as the remote boundary reads it."""

    def __init__(self, stdout: str, stderr: str, code: int = 0) -> None:
        self.stdout, self.stderr, self.code = stdout, stderr, code

    def run_script(self, script: str, timeout_s: float) -> tuple[int | None, str, str, bool]:
        found = re.search(r"@@CA:(\w+):0:out", script)
        assert found is not None, script
        mark = f"@@CA:{found.group(1)}:0:"
        out = f"{mark}out\n{self.stdout}\n{mark}end:{self.code}\n"
        return 0, out, f"{mark}err\n{self.stderr}\n{mark}errend\n", False

    def put(self, local_path: str, remote_path: str) -> None:
        return None

    @property
    def node_name(self) -> str:
        return "node01"


def _through_the_boundary(stdout: str, stderr: str = "", code: int = 0) -> NodeResult:
    return _NodeShell(stdout, stderr, code).run_batch([RemoteCommand("gpu_bench", "true")], 60.0)


def test_masked_before_cut_so_no_secret_is_cut_in_two() -> None:
    """Evidence is cut to fit a row; a cut inside a secret would leave a piece that masking no longer knows.
    Node text is masked where it enters the controller, so every later cut is of masked text."""
    url = "postgres://svc:S3KR1Tcutpassword@db/x\n"
    secret_at = url.index("S3KR1T")
    row = CheckRow("nccl_env", "NCCL_SOCKET_IFNAME", Status.FAIL, "value_mismatch", "eth9", "eth0", "")
    head = "x" * (RAW_OUTPUT_LIMIT - secret_at - 6) + url  # kept: up to the middle of the password
    assert "S3KR1T" in keep_head(head + "y" * 100, RAW_OUTPUT_LIMIT)  # cut first: a piece the mask misses
    assert "S3KR1T" not in node_row("r", "c", "preflight", "node01", row, entered(head + "y" * 100)).raw_output
    head = "z" * (RAW_OUTPUT_LIMIT - 21) + " " + GH  # kept: 16 characters of the token
    assert "S3KR1T" not in node_row("r", "c", "preflight", "node01", row, entered(head)).raw_output
    head = "x" * (4_000 - len("bad\n") - secret_at - 6) + url
    assert "S3KR1T" not in error_row("driver", "unparsable_output", "bad", entered(head)).detail
    tail = url + "y" * (20_000 - len(url) + url.index("vc:"))  # kept: from inside the user, past '://'
    stderr = "e" * 3_000 + " " + HF + "f" * (4_000 - len(HF) + 1)  # kept: from inside the prefix
    assert "S3KR1T" in probe_runs._raw(CommandResult("gpu_bench", 1, tail, stderr))  # cut, never masked
    result = _through_the_boundary(tail, stderr, 1).commands[0]
    assert result.exit_code == 1 and "S3KR1T" not in probe_runs._raw(result)


def test_checkpoints_hold_the_node_output_masked(tmp_path: Path) -> None:
    """What a checkpoint saves is the node's result as the boundary gave it: masked there, never again."""
    stdout = f"### env\nNCCL_PASSWD=S3KR1T\nNCCL_DB_URL=postgres://u:S3KR1T@db/x\nNCCL_NOTE={GH}\n### end"
    result = _through_the_boundary(stdout, f"warning: {JWT}")
    result.commands[0] = replace(result.commands[0], name="nccl_env")
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save_node("preflight", result)
    saved = next((tmp_path / "checkpoints" / "preflight").iterdir()).read_text()
    assert "S3KR1T" not in saved and "NCCL_PASSWD=***" in saved and "ghp_***" in saved
    loaded = checkpoints.load_nodes("preflight")["node01"]
    assert loaded.status is NodeStatus.OK and loaded.commands == result.commands
    assert nccl_env.parse(loaded.commands[0].stdout, 0) == nccl_env.parse(entered(stdout), 0)


def test_a_rate_of_tokens_is_a_throughput_not_a_secret() -> None:
    assert not is_secret_name("training_tokens_per_s_per_gpu_vs_cluster")
    assert not is_secret_name("tokens_per_s")
    assert is_secret_name("HF_TOKEN") and is_secret_name("API_TOKENS") and is_secret_name("tokens_file")
    assert mask_value("training_tokens_per_s_per_gpu", "143572.3") == "143572.3"
    said = entered("training_tokens_per_s_per_gpu: 143572.3\ntokens_per_s=9.5e5")  # as a node printed it
    assert said == "training_tokens_per_s_per_gpu: 143572.3\ntokens_per_s=9.5e5"
