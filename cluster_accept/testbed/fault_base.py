"""The shape every test-bed fault shares: a strict model with its ``kind``, written back to a plan file as it was
read (:mod:`testbed.faults` lists the kinds)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str

    def as_yaml(self) -> Any:
        """The plan-file form of this fault (bare kind when it has no parameters)."""
        params = self.model_dump(exclude={"kind"}, exclude_defaults=True)
        return self.kind if not params else {self.kind: params}
