"""SSH key files for tests that load inventories naming them (made with cryptography, paramiko's own dependency)."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def write_key(path: Path, passphrase: bytes | None = None) -> Path:
    """An ed25519 private key in OpenSSH format (encrypted with ``passphrase``), and its .pub beside it."""
    key = Ed25519PrivateKey.generate()
    crypt = serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, crypt))
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    path.with_name(path.name + ".pub").write_bytes(public + b" test\n")
    return path


def operator_home(home: Path) -> Path:
    """``home`` with the ~/.ssh files the example contract names (id_ed25519, known_hosts)."""
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    write_key(home / ".ssh" / "id_ed25519")
    (home / ".ssh" / "known_hosts").write_text("")
    return home
