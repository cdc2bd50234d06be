"""What a plug-in declares beside its rows: the expectations of a profile it answers, and the findings that can
explain its own.

A check or a probe states, in its own module, which keys of a profile its rows judge (:class:`Expectation`:
no silent pass, :mod:`analysis.coverage`) and which findings of other checks can be the cause of its findings
(:class:`Link`: cause first, :mod:`analysis.causes`). The stages gather these declarations from the plug-ins
they run; there is no central table to edit when a plug-in is added.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from cluster_accept.vocabulary.rows import NodeRow


@dataclass(frozen=True)
class Link:
    """Findings of ``cause_check`` (any reason, or one of ``reasons``) explain findings of ``symptoms`` written
    in ``stage``; with ``same_gpu``, only on the GPU the cause names (a cause naming no GPU covers them all).
    Where several links explain one symptom, the one declared first is the likelier cause."""

    cause_check: str
    symptoms: frozenset[str]
    stage: str
    reasons: frozenset[str] = frozenset()
    same_gpu: bool = False
    symptom_reasons: frozenset[str] = frozenset()  # only these symptoms (empty: any finding of those checks)

    def explains(self, cause: NodeRow, symptom: NodeRow) -> bool:
        if cause is symptom or cause.check != self.cause_check or symptom.check not in self.symptoms:
            return False
        if self.symptom_reasons and symptom.reason not in self.symptom_reasons:
            return False
        if symptom.stage != self.stage or (self.reasons and cause.reason not in self.reasons):
            return False
        return not (self.same_gpu and cause.gpu is not None and symptom.gpu is not None and cause.gpu != symptom.gpu)


@dataclass(frozen=True)
class Expectation:
    """``name`` (the profile's key) is judged by a row of ``check`` (whose item starts with ``item``, when
    given) written in ``stage``; ``stated`` says whether a profile states it. A row of a ``settled_by`` check
    that is not a pass settles it too: a probe that failed or was skipped could not judge what it carries.
    ``per_item``: an expectation for each item the profile lists (each ``nccl_env`` key its own)."""

    name: str
    stage: str
    check: str
    stated: Callable[[Any], bool]  # (inventory.model.Profile) -> bool
    item: str | None = None
    settled_by: tuple[str, ...] = ()
    settling_reasons: frozenset[str] = frozenset()  # when given, only these reasons of settled_by settle it
    per_item: Callable[[Any], Iterable[str]] | None = None

    def of(self, profile: Any) -> list[Expectation]:
        """What this declaration expects of ``profile``: itself, one per listed item, or nothing."""
        if not self.stated(profile):
            return []
        if self.per_item is None:
            return [self]
        return [replace(self, name=f"{self.name}.{item}", item=item, per_item=None) for item in self.per_item(profile)]


def always(profile: Any) -> bool:
    """An expectation every profile states (a check that always runs)."""
    return True


def is_set(get: Callable[[Any], object]) -> Callable[[Any], bool]:
    """Stated when the profile sets what ``get`` reads."""
    return lambda profile: get(profile) is not None


def threshold_set(key: str) -> Callable[[Any], bool]:
    """Stated when the profile sets the threshold ``key`` (``gemm_bf16_tflops_min`` …)."""
    return lambda profile: getattr(profile.thresholds, key) is not None
