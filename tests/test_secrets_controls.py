"""What a terminal draws as nothing cannot hide a secret from the mask: a colour code right before a token, a
title or hyperlink sequence, other escapes, a zero-width or bidi character or a backspace between a key's
characters, and a CR overprinting a value. Checked on the masking itself and where node text enters the
controller (a batch's commands, a detached rank's poll, an srun task)."""

from __future__ import annotations

import pytest

from cluster_accept.inventory.model import DEFAULT_SSH, Node, Profile
from cluster_accept.remote.batch import parse_batch
from cluster_accept.remote.detached import parse_poll
from cluster_accept.remote.result import RemoteCommand
from cluster_accept.remote.srun import _task_run
from cluster_accept.remote.srun_script import TaskOutput
from cluster_accept.vocabulary.secrets import mask_secrets

AWS = "AKIAIOSFODNN7EXAMPLE"  # AWS's documented example key id: the prefix and 16 characters
GITHUB = "ghp_" + "a1B2" * 9

HIDDEN = {
    "colour before the token": (f"\x1b[31m{AWS}\x1b[0m", "AKIA***"),
    "colour with parameters": (f"id \x1b[1;38;5;196m{AWS}\x1b[m", "id AKIA***"),
    "8-bit CSI": (f"\x9b31m{AWS}", "AKIA***"),
    "colour inside the token": (f"ghp_\x1b[01;31m{GITHUB[4:]}\x1b[m", "ghp_***"),
    "grep --color around a name": ("API_\x1b[01;31m\x1b[KKEY\x1b[m\x1b[K=hunter2-hunter2", "API_KEY=***"),
    "bare escape (save cursor)": (f"\x1b7{AWS}", "AKIA***"),
    "charset escape": (f"\x1b(B{AWS}", "AKIA***"),
    "zero-width space inside": ("AKIA\u200bIOSFODNN7EXAMPLE", "AKIA***"),
    "word joiner inside": ("hf_\u2060" + "Ab1" * 11, "hf_***"),
    "soft hyphen in a name": ("MY_TOK\u00adEN=hunter2", "MY_TOKEN=***"),
    "bidi override inside": ("AKIA\u202eIOSFODNN7EXAMPLE", "AKIA***"),
    "backspace overprint": ("AKIAX\x08IOSFODNN7EXAMPLE", "AKIA***"),
    "NUL inside": ("AKIA\x00IOSFODNN7EXAMPLE", "AKIA***"),
}


@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_a_secret_hidden_by_what_a_terminal_draws_as_nothing_is_masked(case: str) -> None:
    text, expected = HIDDEN[case]
    assert mask_secrets(text) == expected
    assert mask_secrets(expected) == expected


def test_sequences_after_a_token_keep_it_masked_and_the_text_around_it() -> None:
    text = f"\x1b]0;title\x07{AWS}\nnext \x1b]8;;https://example.org\x1b\\{AWS}\x1b]8;;\x1b\\ line\n"
    assert (
        mask_secrets(text)
        == "\x1b]0;title\x07AKIA***\nnext \x1b]8;;https://example.org\x1b\\AKIA***\x1b]8;;\x1b\\ line\n"
    )


def test_text_whose_sequences_hide_nothing_is_kept_as_it_came() -> None:
    for text in ("GPU 0 \x1b[32mOK\x1b[0m\n", "a=1\x00b=2\x00", "\ufeffheader\n", "progress 10%\rprogress 100%\n"):
        assert mask_secrets(text) == text


def test_a_cr_does_not_end_a_secret_value() -> None:
    assert mask_secrets("HF_TOKEN=abc\rdefghij\r\nnext=1\r\n") == "HF_TOKEN=***\r\nnext=1\r\n"


def test_a_batch_poll_and_srun_task_mask_a_token_after_a_colour_code() -> None:
    printed = f"driver \x1b[31m{AWS}\x1b[0m\n"
    nonce = "0123456789abcdef"
    stdout = f"@@CA:{nonce}:0:out\n{printed}\n@@CA:{nonce}:0:end:0\n"
    stderr = f"@@CA:{nonce}:0:err\n{printed}\n@@CA:{nonce}:0:errend\n"
    (result,) = parse_batch([RemoteCommand("c", "true", reads_only=True)], stdout, stderr, nonce)
    assert (result.stdout, result.stderr) == ("driver AKIA***\n", "driver AKIA***\n")
    polled = parse_poll(0, "ended 0\n" + printed, printed)
    assert polled is not None and (polled.stdout, polled.stderr) == ("driver AKIA***\n", "driver AKIA***\n")
    node = Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=Profile(), address="10.0.0.1")
    task = TaskOutput(0, "n1", [printed.rstrip("\n")], 0)
    rank = _task_run(node, RemoteCommand("rank", "true", timeout_s=60), task, False, 1.0)
    assert rank.result is not None and rank.result.stdout == "driver AKIA***\n"
