"""Node text is masked whole before it is cut, wherever it is cut, and the cut says what it kept; the shapes of
secret that slipped through (a URL password holding ``/`` or ``@``, ``sk-proj-`` keys without a digit, curl's
``-u user:password`` and its siblings) are masked, and ordinary node text is left as it was."""

from __future__ import annotations

import base64
import time

import pytest

from cluster_accept.analysis.nccl_log import failure_lines
from cluster_accept.analysis.probe_output import parse_json_lines
from cluster_accept.checks import infiniband
from cluster_accept.inventory.model import DEFAULT_SSH, Node, Profile
from cluster_accept.remote.detached import POLL_ERROR_CHARS, START_ERROR_CHARS
from cluster_accept.remote.result import NoAnswer, NodeStatus, RemoteCommand
from cluster_accept.remote.session import NodeSession
from cluster_accept.remote.sessions import SessionCache
from cluster_accept.remote.shell import ERROR_TAIL_CHARS, ShellSession
from cluster_accept.vocabulary.secrets import mask_secrets, masked_head, masked_tail
from cluster_accept.vocabulary.text import keep_head, keep_tail
from tests.boundary import entered

VALUE = "SuperSecretValue123"
BASIC = base64.b64encode(b"bot:S3KR1T").decode()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # URL passwords, whatever they hold: '/' (base64), '@', both; the rest of the line stays
        ("connect postgres://u:S3KR1T/sl/ash+x=@h/x failed", "connect postgres://u:***@h/x failed"),
        ("DB=postgres://u:sl/ash+x=@h/x; retry", "DB=postgres://u:***@h/x; retry"),
        (
            "mirror https://bot:S3KR1T@a/b@registry.example/v2 (retry 2)",
            "mirror https://bot:***@registry.example/v2 (retry 2)",
        ),
        ("https://me@corp.com:S3KR1T/x@git.corp.com/r.git", "https://me@corp.com:***@git.corp.com/r.git"),
        (  # compact JSON: a quoted URL ends at its closing quote, an escaped quote inside it does not end it
            '{"url":"redis://:S3KR1T\\"q/@cache:6379/0","owner":"ops@corp"}',
            '{"url":"redis://:***@cache:6379/0","owner":"ops@corp"}',
        ),
        (
            "from postgres://a:S3KR1T/1@h1/x to postgres://b:S3KR1T/2@h2/y\nnext line user@host",
            "from postgres://a:***@h1/x to postgres://b:***@h2/y\nnext line user@host",
        ),
        # OpenAI project keys need no digit; a plain sk- key with mixed case is no hyphenated word
        ("using sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh now", "using sk-proj-*** now"),
        ("k=sk-svcacct-AbCdEfGhIjKlMnOpQrStUv_-xYz end", "k=sk-svcacct-*** end"),
        ("sk-AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGhIjKl,", "sk-***,"),
        # curl's password: -u, -uATTACHED, --user, --user=, quoted, -U / --proxy-user
        ("curl -u deploy:S3KR1T/x@y https://h/api -o out", "curl -u deploy:*** https://h/api -o out"),
        ("curl --user deploy:S3KR1T https://h", "curl --user deploy:*** https://h"),
        ("curl -udeploy:S3KR1T https://h", "curl -udeploy:*** https://h"),
        ("curl --user=deploy:S3KR1T https://h", "curl --user=deploy:*** https://h"),
        ("curl -u ':S3KR1T' https://h", "curl -u ':***' https://h"),
        ('curl -u "deploy:S3KR1T x" https://h', 'curl -u "deploy:***" https://h'),
        ("curl -x p:3128 -U squid:S3KR1T h", "curl -x p:3128 -U squid:*** h"),
        ("curl --proxy-user squid:S3KR1T h", "curl --proxy-user squid:*** h"),
        # siblings: a secret option's value after a space, -p of the tools that take a password there
        ("run --password S3KR1T --host db1", "run --password *** --host db1"),
        ("train.py --hf-token hf_S3KR1T --steps 10", "train.py --hf-token *** --steps 10"),
        ("sshpass -p S3KR1T ssh node01 true", "sshpass -p *** ssh node01 true"),
        ("mysql -h db -u root -pS3KR1T jobs", "mysql -h db -u root -p*** jobs"),
        ("docker login -u bot -p S3KR1T registry.example", "docker login -u bot -p *** registry.example"),
        (
            "machine api.example login bot password S3KR1T\nmachine b",
            "machine api.example login bot password ***\nmachine b",
        ),
        ('curl -H "X-Api: Bearer S3KR1Tabcdefghij0123" https://h', 'curl -H "X-Api: Bearer ***" https://h'),
        (f"via proxy, Basic {BASIC} sent", "via proxy, Basic *** sent"),
    ],
)
def test_missed_secret_shapes_are_masked_and_the_text_around_them_survives(text: str, expected: str) -> None:
    assert mask_secrets(text) == expected
    assert "S3KR1T" not in mask_secrets(text)
    assert mask_secrets(expected) == expected  # masking twice changes nothing


@pytest.mark.parametrize(
    "text",
    [
        "https://example.com/a/b?c=d http://host:8080/path ssh://git@host/x git@github.com:org/repo.git",
        "https://u@host:8443/repo.git file:///tmp/a:b@c",
        "ssh user@host ok; connected to 10.0.0.1:29500, a:b c:d, node01:22",
        "node01:1234:1234 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via NET/IB/0/GDRDMA",
        "node01:1234:1234 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>",
        "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint node01:29500 train.py",
        "docker run -u 1000:1000 -p 8080:80 img; python -u train.py; git push -u origin main; sort -u a.txt",
        "ssh -p 22 node01; mysql -u root -p jobs; pip install --user torch",
        "usage: train.py [-h] [--hf-token HF_TOKEN] [--tokenizer NAME]",
        "Basic connectivity checks passed; bearer tokens are rotated daily",
        "sk-only-letters-in-a-long-hyphenated-identifier-here",
        "Last login: Mon Jan  1 00:00:00 2024 from 10.0.0.2",
        "iteration 1200/5000 | loss 2.3451 | lr 3.0e-4 | tokens/s 143572.3",
    ],
)
def test_ordinary_node_text_is_not_mangled(text: str) -> None:
    assert mask_secrets(text) == text


@pytest.mark.parametrize(
    ("assignment", "left"), [("export DB_PASSWD=", "SWD="), ("PASSWORD=", "ORD="), ("HF_TOKEN=", "EN=")]
)
def test_a_secret_straddling_a_tail_cut_does_not_survive_and_the_cut_says_what_it_kept(
    assignment: str, left: str
) -> None:
    text = "x" * 1000 + "\n" + assignment + VALUE
    kept = len(left + VALUE)
    assert keep_tail(text, kept).endswith("\n" + left + VALUE)  # cut first: the name is gone ...
    assert VALUE in mask_secrets(keep_tail(text, kept))  # ... and with it what the mask knows
    tail = masked_tail(text, kept)
    assert VALUE not in tail
    assert tail.startswith(f"[truncated: kept the last {kept:,} of {len(mask_secrets(text)):,} characters] …\n")


def test_a_secret_straddling_a_head_cut_does_not_survive_and_the_cut_says_what_it_kept() -> None:
    url = "postgres://svc:S3KR1T/sl/ash@db/x\n" + "y" * 100
    assert "S3KR1T" in mask_secrets(keep_head(url, 24))  # cut first: no '@' left to end the password
    head = masked_head(url, 24)
    assert "S3KR1T" not in head
    assert head.endswith(f"\n… [truncated: kept the first 24 of {len(mask_secrets(url))} characters]")
    assert masked_tail("short", 300) == "short" and masked_head("short", 300) == "short"  # no cut, no note


def _straddling(limit: int) -> str:
    """stderr whose last ``limit`` characters begin inside a secret's name: ``SWD=SuperSecretValue123``."""
    tail = f"SWD={VALUE}\n"
    return "e" * 3000 + "\nexport DB_PAS" + tail + "f" * (limit - len(tail))


class _Session(ShellSession):
    """A node's shell session that answers every script with ``answer``."""

    def __init__(self, answer: tuple[int | None, str, str, bool]) -> None:
        self.answer = answer

    def run_script(self, script: str, timeout_s: float) -> tuple[int | None, str, str, bool]:
        return self.answer

    def put(self, local_path: str, remote_path: str) -> None:
        return None


def _node() -> Node:
    return Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=Profile(), address="10.0.0.1")


def _assert_masked_cut(said: str, limit: int, total: int) -> None:
    assert VALUE not in said and VALUE not in mask_secrets(said)  # nor after the store-time mask
    assert f"[truncated: kept the last {limit:,} of {total:,} characters] …\n" in said
    assert said.endswith("SWD=***\n" + "f" * (limit - len(f"SWD={VALUE}\n")))


def test_a_failed_batch_detail_is_masked_then_cut() -> None:
    stderr = _straddling(ERROR_TAIL_CHARS)
    assert VALUE in stderr.strip()[-ERROR_TAIL_CHARS:]  # what a cut before the mask kept
    commands = [RemoteCommand("a", "true")]
    batch = _Session((1, "", stderr + "\n", False)).run_batch(commands, 120.0)
    assert batch.status is NodeStatus.ERROR and batch.detail.startswith("batch exited 1: [truncated: ")
    _assert_masked_cut(batch.detail, ERROR_TAIL_CHARS, len(mask_secrets(stderr)))


def test_a_failed_poll_is_masked_then_cut() -> None:
    stderr = _straddling(POLL_ERROR_CHARS)
    session: NodeSession = _Session((255, "", stderr, False))
    said = SessionCache(4, lambda node: session).run(_node(), lambda s: s.poll_detached("/tmp/ca.x", 123, None))
    assert isinstance(said, NoAnswer)
    _assert_masked_cut(said.why, POLL_ERROR_CHARS, len(mask_secrets(stderr)))


@pytest.mark.parametrize("stream", ["err", "out"])
def test_a_failed_start_is_masked_then_cut(stream: str) -> None:
    text = _straddling(START_ERROR_CHARS)
    out, err = (text, "") if stream == "out" else ("", text)
    said = _Session((1, out, err, False)).start_detached("/tmp/ca.x", RemoteCommand("r", "true"), 60.0, "t")
    assert isinstance(said, NoAnswer)
    _assert_masked_cut(said.why, START_ERROR_CHARS, len(mask_secrets(text)))


def test_the_new_shapes_are_linear_in_hostile_output() -> None:
    hostile = [
        "x://a:@" * 100_000,
        '"a://u:x' * 100_000,
        "http://u:" + "@" * 500_000,
        "-u " * 200_000,
        '-u "a:' * 100_000,
        "--password " * 100_000,
        "mysql -x " * 60_000,
        "docker login " * 50_000,
        "machine a " * 60_000,
        "Bearer " * 100_000,
        "Basic " + "A" * 500_000,
        "sk-proj-" * 100_000,
    ]
    started = time.monotonic()
    for text in hostile:
        mask_secrets(text)
    assert time.monotonic() - started < 10  # linear: about a second in all; quadratic: minutes


# Parsers that quote a line of node output they cannot read: masked where it entered the controller, then cut by
# the parser, the cut said. The URL's password straddles the cut: cut first, no '@' is left after it and the piece
# of it kept is no longer a URL password. The parsers mask nothing themselves: they get the output as it entered.


def _url_straddling(limit: int, before: str = "") -> str:
    pad = "z" * (limit - len(before) - 30)
    return f"{before}{pad} postgres://svc:{VALUE}/x@db/name " + "z" * 100


def _assert_head_cut(said: str, text: str, limit: int) -> None:
    assert VALUE[:6] in text[:limit]  # what a cut before the mask kept
    assert VALUE[:6] not in said and VALUE[:6] not in mask_secrets(said)
    total = len(mask_secrets(text))
    assert said.endswith(f"\n… [truncated: kept the first {limit} of {total} characters]"), said


def test_an_unexpected_infiniband_line_is_masked_then_cut() -> None:
    line = _url_straddling(200)
    said = infiniband.parse(entered(f"### ports\n{line}\n### end\n")).error
    assert said is not None and said.startswith("unexpected port line 'zzz")
    _assert_head_cut(said, line, 200)


def test_unreadable_probe_lines_are_masked_then_cut() -> None:
    unreadable, without_metric = _url_straddling(200, '{"note": '), _url_straddling(200, '{"note": "') + '"}'
    errors = parse_json_lines(entered(unreadable + "\n" + without_metric + "\n")).errors
    assert errors[0].startswith("unreadable probe line: {") and errors[1].startswith("probe line without metric")
    _assert_head_cut(errors[0], unreadable, 200)
    _assert_head_cut(errors[1], without_metric, 200)


def test_a_failure_line_of_a_run_is_masked_then_cut() -> None:
    text = _url_straddling(300, "RuntimeError: NCCL error: unhandled system error ")
    (line,) = failure_lines(entered(text))
    _assert_head_cut(line, text, 300)
