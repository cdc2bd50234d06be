"""What a plug-in's outputs look like, declared beside it: its samples.

Each check and probe names, in its own module, what its command prints on a healthy node, on a faulty one and
where its tool is missing or dead (:class:`Sample`), each with the reasons its rows must carry. A sample's text is
inline or a file of the repository (a real capture stays where it was taken: the sample points at it). The
fuzzing of the parsers starts from them, the tests judge each one and hold its reasons, and the scale simulator
answers a command its recording lacks with the plug-in's healthy sample: adding a plug-in adds its samples, and
no list elsewhere.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# The repository a sample's file is named from (``tests/data/...``, ``cluster_accept/testbed/captures/...``).
# The captured outputs samples point at (``fixture=``): package data, so a wheel carries them.
SAMPLES_DIR = Path(__file__).resolve().parent.parent / "samples"
_COMMAND_LINE = re.compile(r"^\$ ")
_EXIT_LINE = re.compile(r"^\[exit (-?\d+)\]\s*$")


class SampleKind(enum.Enum):
    """What a sample shows: a healthy node, a fault the plug-in finds, or its tool missing or dead."""

    HEALTHY = "healthy"
    FAULT = "fault"
    DEAD = "dead"  # the tool missing, or dead (a driver it cannot reach, a crash)


@dataclass(frozen=True)
class Sample:
    """One output of a plug-in's command and what its rows must say of it.

    ``text`` is the output itself, or ``fixture`` a file of the repository holding it (a capture framed as
    ``$ command`` … ``[exit N]`` is read without its frame); ``exit_code`` the command's status; ``reasons`` the
    reason codes its rows must carry (a healthy sample's rows pass); ``profile`` the profile's keys it is judged
    under, where its finding depends on one (the minimum a slow figure misses); ``majority`` the cluster's
    values it is judged against, where its finding is a difference from its peers."""

    name: str
    kind: SampleKind
    reasons: frozenset[str]
    text: str = ""
    fixture: str | None = None
    exit_code: int | None = 0
    profile: Mapping[str, Any] = field(default_factory=dict)
    majority: Mapping[str, str] = field(default_factory=dict)

    def judged(self, reasons: Iterable[str], profile: Mapping[str, Any] | None = None) -> Sample:
        """The same output as another plug-in reading the same run judges it: its own reasons (and the profile
        its minimums are held to, where it has its own), the output declared once, beside the run."""
        return replace(self, reasons=frozenset(reasons), profile=self.profile if profile is None else profile)

    def output(self) -> str:
        """What the command printed: the inline text, or the fixture's (its capture frame left out)."""
        if self.fixture is None:
            return self.text
        lines = (SAMPLES_DIR / self.fixture).read_text(encoding="utf-8").splitlines(keepends=True)
        if lines and _COMMAND_LINE.match(lines[0]) and _EXIT_LINE.match(lines[-1]):
            lines = lines[1:-1]
        return "".join(lines)


def healthy(name: str, reasons: Iterable[str] = ("ok",), **output: Any) -> Sample:
    """A healthy node's output (``text=`` or ``fixture=``, ``exit_code=``, ``profile=``)."""
    return Sample(name, SampleKind.HEALTHY, frozenset(reasons), **output)


def fault(name: str, reasons: Iterable[str], **output: Any) -> Sample:
    """A faulty node's output and the reasons its rows must carry."""
    return Sample(name, SampleKind.FAULT, frozenset(reasons), **output)


def dead(name: str, reasons: Iterable[str], **output: Any) -> Sample:
    """The output where the tool is missing or dead, and the reasons its rows must carry."""
    return Sample(name, SampleKind.DEAD, frozenset(reasons), **output)


def missing_kinds(samples: Iterable[Sample]) -> list[str]:
    """The kinds of sample a plug-in must declare and does not (a healthy one, a fault, its tool dead)."""
    have = {sample.kind for sample in samples}
    return [kind.value for kind in SampleKind if kind not in have]


def first_healthy(samples: Iterable[Sample]) -> Sample | None:
    """The plug-in's first healthy sample: what a node with nothing else to say answers."""
    return next((sample for sample in samples if sample.kind is SampleKind.HEALTHY), None)


# What every nvidia-smi call prints (exit 9) on a node whose driver it cannot reach: the dead tool of the checks
# that ask nvidia-smi.
DRIVER_UNREACHABLE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def driver_unreachable(reasons: Iterable[str]) -> Sample:
    """The sample of a check that asks nvidia-smi, on a node whose driver nvidia-smi cannot reach."""
    return dead("driver_unreachable", reasons, text=DRIVER_UNREACHABLE, exit_code=9)
