"""The controller's own files an inventory names — SSH keys and known_hosts — checked before any node is.

A key that is missing, unreadable, a public key, or locked by a passphrase (cluster-accept never prompts)
fails the same way on every node: reported per node, it would read as a thousand nodes refusing
authentication, and with ``--drain`` take them out of service over a typo. So these are inventory errors,
found when the inventory loads and named with the file and the nodes that use it. Pure standard library:
the key is read as text (PEM or OpenSSH armour), not parsed by an SSH library.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable
from pathlib import Path

from cluster_accept.inventory.hostlist import fold
from cluster_accept.inventory.model import Node
from cluster_accept.inventory.quoting import quoted

_BEGIN = re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----")
_OPENSSH_BODY = re.compile(
    r"-----BEGIN OPENSSH PRIVATE KEY-----\s*(?P<body>[A-Za-z0-9+/=\s]+?)\s*-----END OPENSSH PRIVATE KEY-----"
)
_PUBLIC = re.compile(r"^(ssh-|ecdsa-sha2-|sk-)[\w.@-]+ AAAA")
_OPENSSH_MAGIC = b"openssh-key-v1\0"
KEY_READ_LIMIT = 256 * 1024


def _encrypted_openssh(text: str) -> bool:
    """Whether an OpenSSH-format key names a cipher other than ``none`` (it needs a passphrase)."""
    match = _OPENSSH_BODY.search(text)
    if match is None:
        return False
    try:
        blob = base64.b64decode("".join(match.group("body").split()))
    except ValueError:
        return False
    if not blob.startswith(_OPENSSH_MAGIC):
        return False
    start = len(_OPENSSH_MAGIC)
    length = int.from_bytes(blob[start : start + 4], "big")
    return blob[start + 4 : start + 4 + length] != b"none"


def identity_problem(path: Path) -> str | None:
    """What is wrong with ``path`` as a private key for unattended SSH; None when nothing is."""
    if not path.exists():
        return "does not exist"
    if not path.is_file():
        return "is not a file"
    if not os.access(path, os.R_OK):
        return "cannot be read by this user"
    try:
        text = path.read_bytes()[:KEY_READ_LIMIT].decode("utf-8", "replace")
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if _PUBLIC.match(text.lstrip()):
        return "is a public key: name the private key (the file without .pub)"
    begin = _BEGIN.search(text)
    if begin is None:
        return "is not a private key (no '-----BEGIN … PRIVATE KEY-----' line)"
    locked = "ENCRYPTED" in begin.group(1) or "Proc-Type: 4,ENCRYPTED" in text or _encrypted_openssh(text)
    if locked and not os.environ.get("SSH_AUTH_SOCK"):
        return "is protected by a passphrase and no ssh-agent is running: cluster-accept never prompts"
    return None


def known_hosts_problem(path: Path, policy: str | None) -> str | None:
    """What is wrong with ``path`` as the known_hosts of ``policy``: ``strict`` reads it, so it must exist;
    ``accept-new`` appends to it, so it (or the folder it will be created in) must be writable."""
    if path.exists():
        if not path.is_file():
            return "is not a file"
        if not os.access(path, os.R_OK):
            return "cannot be read by this user"
        if policy == "accept-new" and not os.access(path, os.W_OK):
            return "cannot be written by this user (host_key_policy accept-new adds new keys to it)"
        return None
    if policy != "accept-new":
        return "does not exist (host_key_policy strict needs the nodes' keys; accept-new would record them)"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not os.access(folder, os.W_OK):
        return f"does not exist and cannot be created ({folder} is not writable)"
    return None


def ssh_file_problems(nodes: Iterable[Node]) -> list[str]:
    """One line per (setting, file) that cannot serve, naming the file and the nodes that use it."""
    users: dict[tuple[str, str, str], list[str]] = {}
    for node in nodes:
        if node.is_local:
            continue
        ssh = node.ssh
        if ssh.identity_file:
            problem = identity_problem(Path(ssh.identity_file).expanduser())
            if problem:
                users.setdefault(("identity_file", ssh.identity_file, problem), []).append(node.name)
        if ssh.known_hosts:
            problem = known_hosts_problem(Path(ssh.known_hosts).expanduser(), ssh.host_key_policy)
            if problem:
                users.setdefault(("known_hosts", ssh.known_hosts, problem), []).append(node.name)
    return [f"ssh.{key} {quoted(path)} ({fold(names)}): {problem}" for (key, path, problem), names in users.items()]
