"""Read an ``NCCL_DEBUG=INFO`` log: the transport of every connection, NCCL's version, and its warnings.

NCCL prints one line per connection it sets up, in shapes that differ by transport and by version:

- ``Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM`` (also ``P2P/CUMEM/read``, ``P2P/IPC``, ``P2P/direct pointer``,
  and ``P2P/1`` in old versions);
- ``Channel 00 : 2[2] -> 3[3] via SHM/direct/direct`` (NCCL 2.28 prints SHM channels without ``/NN``);
- ``Channel 00/0 : 0[0] -> 8[8] [send] via NET/IB/0/GDRDMA`` (``NET/Socket/0``, ``NET/Libfabric/0/GDRDMA``,
  a plug-in's name), and ``0[0] -> 8[0] [send] via NET/IB/0`` without the channel prefix;
- ``CollNet 00/0 : 0 [send] via COLLNET/IB/0/GDRDMA`` (``Coll 00 :`` in old versions);
- NVLS has no per-connection line: ``Connected NVLS tree``, ``NVLS comm … headRank`` or ``N nvls channels``
  with N > 0 say it is in use.

Each is folded to a name a profile can expect: the device index goes, GPUDirect RDMA stays
(``NET/IB/GDRDMA``), so ``NET/IB`` is satisfied by both while ``NET/IB/GDRDMA`` demands GPUDirect.
Pure functions: nothing here raises on odd input.
"""

from __future__ import annotations

import re

from cluster_accept.vocabulary.text import keep_head

# "<prefix> : a[b] -> c[d] [send] via X" or "CollNet 00/0 : 0 [send] via X": the connection and its transport.
_VIA = re.compile(
    r"NCCL INFO (?:(?:Channel|CollNet|Coll) \d+(?:/\d+)? : )?"
    r"(?:\d+\[\d+\](?: -> \d+\[\d+\])?|\d+)(?:\s+\[(?:send|receive)\])?\s+via (\S+)"
)
_NVLS_CHANNELS = re.compile(r"NCCL INFO .*?\b(\d+) nvls channels")
_NVLS_CONNECTED = re.compile(r"NCCL INFO (?:Connected NVLS|NVLS comm 0x[0-9a-f]+ headRank)")
_NCCL_VERSION = re.compile(r"NCCL INFO NCCL version (\S+)")
_WARN = re.compile(r"NCCL WARN (.*)")
_DEVICE_INDEX = re.compile(r"^\d+$")


def normalise_transport(via: str) -> str:
    """One connection's ``via`` text → the transport's name.

    ``P2P/CUMEM/read`` stays; ``P2P/direct`` (from ``P2P/direct pointer``) stays; ``P2P/1`` → ``P2P``;
    ``SHM/direct/direct`` → ``SHM``; ``NET/IB/0/GDRDMA`` → ``NET/IB/GDRDMA``; ``NET/Socket/0`` → ``NET/Socket``;
    ``COLLNET/IB/0/GDRDMA(PCI)`` → ``COLLNET/IB/GDRDMA``."""
    parts = [re.sub(r"\(.*\)$", "", p) for p in via.split("/")]
    kind = parts[0]
    if kind == "SHM":
        return "SHM"
    if kind == "P2P":
        return "/".join(p for p in parts if not _DEVICE_INDEX.match(p)) or "P2P"
    if kind in ("NET", "COLLNET") and len(parts) > 1:
        name = f"{kind}/{parts[1]}"
        return f"{name}/GDRDMA" if "GDRDMA" in parts[2:] else name
    return kind


def nccl_transports(text: str) -> dict[str, int]:
    """How many connections used each transport (NVLS: how many ranks report NVLS channels)."""
    counts: dict[str, int] = {}
    for via in _VIA.findall(text):
        name = normalise_transport(via)
        counts[name] = counts.get(name, 0) + 1
    nvls = sum(1 for n in _NVLS_CHANNELS.findall(text) if n.strip("0"))  # a count above zero, any length
    nvls = nvls or len(_NVLS_CONNECTED.findall(text))
    if nvls:
        counts["NVLS"] = nvls
    return counts


def transport_matches(used: str, expected: str) -> bool:
    """``P2P/CUMEM`` satisfies ``P2P``; ``NET/IB/GDRDMA`` satisfies ``NET/IB``; ``NET/Socket`` does not, nor
    does ``NET/IB`` satisfy ``NET/IB/GDRDMA``."""
    return used == expected or used.startswith(expected.rstrip("/") + "/")


def nccl_version(text: str) -> str | None:
    match = _NCCL_VERSION.search(text)
    return match.group(1) if match else None


def nccl_warnings(text: str, limit: int = 5) -> list[str]:
    """NCCL's own ``WARN`` lines, distinct, first ones first: they say why an initialisation failed."""
    seen: list[str] = []
    for line in _WARN.findall(text):
        line = line.strip()
        if line and line not in seen:
            seen.append(line)
        if len(seen) >= limit:
            break
    return seen


def ran_nccl(text: str) -> bool:
    """Whether the log shows NCCL initialised at all (then its transport should be readable)."""
    return "NCCL INFO" in text


# Lines that say why a distributed run failed, as torch, gloo and NCCL print them (the launcher's own closing
# traceback comes last and says only that a child failed).
_WHY = re.compile(
    r"(NCCL WARN .*|Unable to find address for: .*|.*\b(?:DistNetworkError|DistStoreError|DistBackendError|"
    r"NCCL error|ncclSystemError|ncclInternalError|ncclInvalidUsage|ncclRemoteError|ncclUnhandledCudaError)\b.*|"
    r"^\S*Error: .*|.*Connection refused.*|.*timed out.*)",
    re.MULTILINE,
)


def failure_lines(text: str, limit: int = 4) -> list[str]:
    """The lines of a failed run that say why, first ones first and distinct, at most ``limit``."""
    seen: list[str] = []
    for match in _WHY.finditer(text):
        line = keep_head(match.group(0).strip(), 300)
        if line and line not in seen and "ChildFailedError" not in line:
            seen.append(line)
        if len(seen) >= limit:
            break
    return seen


def why_first(text: str, tail: str) -> tuple[str, str]:
    """(the first line of ``text`` that says why a run failed, ``tail`` led by every such line): evidence that
    opens with the cause rather than with the launcher's closing traceback."""
    why = failure_lines(text)
    return (why[0] if why else ""), ("\n".join(why) + "\n...\n" + tail if why else tail)
