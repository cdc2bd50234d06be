"""The keys a profile gives the checks and probes added beside the built-in ones (``plugins: {name: {...}}``),
checked against each one's own settings model when the inventory loads.

The inventory is read below the probes (they import it), so the models are handed in by the caller that
discovered the probes; a profile naming a probe that declares no settings, or a key its model refuses, is an
inventory error like any other, named with its path.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ValidationError

from cluster_accept.inventory.model import Profile

SettingsModels = Mapping[str, type[BaseModel]]  # probe name -> the model of its keys


def plugin_problems(profiles: Mapping[str, Profile], models: SettingsModels) -> list[str]:
    """Every problem of every profile's ``plugins:``, each with its path."""
    problems: list[str] = []
    for name, profile in profiles.items():
        for probe, given in profile.plugins.items():
            where = f"profiles.{name}.plugins.{probe}"
            model = models.get(probe)
            if model is None:
                known = ", ".join(sorted(models)) or "none"
                problems.append(f"{where}: no check or probe of that name takes settings (those that do: {known})")
                continue
            try:
                model.model_validate(given)
            except ValidationError as exc:
                problems += [_said(where, error) for error in exc.errors()]
    return problems


def _said(where: str, error: Mapping[str, object]) -> str:
    loc = ".".join(str(part) for part in error.get("loc", ()) or ())  # type: ignore[attr-defined]
    return f"{where}{'.' + loc if loc else ''}: {error.get('msg')}"
