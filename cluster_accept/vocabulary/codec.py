"""Typed rows and results to JSON data and back, held to the shape their fields declare.

One codec for everything the controller writes and reads back as JSON (checkpoints, a node's figures): the
field types say what a member may hold, so a saved file or a node's line of another shape is refused with a
:class:`ShapeError` naming the member, never carried on as a silent null or a string where a number belongs.

Both ways are pydantic's, over the dataclasses as they are (no model beside them): :func:`to_data` is
``pydantic_core.to_jsonable_python``, and :func:`from_data` a strict :class:`pydantic.TypeAdapter` that forbids
unknown keys. Its rules are pydantic's strict mode for JSON input, because the data is JSON: a string is no
number, a bool no int (nor an int a bool), an integer is a float, an enum is read by its value, a list as a
``tuple``, a ``NewType`` as its type, ``Any`` holds whatever JSON holds, and every field without a default must be
given. Two things are said here rather than by the dataclasses:

- The data goes to pydantic as JSON text (``validate_json``), not as the Python values ``json.loads`` made of it:
  strict validation of Python input wants enum members and tuples themselves, where JSON holds values and lists.
- The config (``strict``, ``extra="forbid"``) is given to an adapter over a one-member tuple of the class: pydantic
  refuses a config given for a dataclass itself, and a standard-library dataclass, which has none of its own,
  validates under the config around it (nested dataclasses too).

pydantic is imported on first use, not with this module: a node's own check (``check --local``) imports the
vocabulary and may never read a checkpoint or a figure line.
"""

from __future__ import annotations

import json
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from pydantic import TypeAdapter
    from pydantic_core import ErrorDetails, ValidationError

_T = TypeVar("_T")
_SAID = 3  # the problems a ShapeError names, the first ones; the others are counted


class ShapeError(ValueError):
    """Data of another shape than the type it is read as."""


def to_data(value: Any) -> Any:
    """``value`` as JSON data: a dataclass as an object of its fields, an enum as its value, tuples as lists; a
    value JSON has no form for as its text (as the checkpoints' ``json.dumps(default=str)`` writes it)."""
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value, fallback=str)


@cache
def _adapter(cls: type[Any]) -> TypeAdapter[tuple[Any]]:
    from pydantic import ConfigDict, TypeAdapter

    form: Any = tuple[cls]  # type: ignore[valid-type]  # a type built at run time, read by pydantic alone
    return TypeAdapter(form, config=ConfigDict(strict=True, extra="forbid"))


def from_data(cls: type[_T], data: Any, where: str = "") -> _T:
    """``data`` read as the dataclass ``cls``: every member one of its fields and of that field's type, every field
    without a default given; anything else raises :class:`ShapeError`, naming the members (``where``, else the
    class's name, then the path to each)."""
    from pydantic_core import ValidationError

    name = where or cls.__name__
    try:
        text = json.dumps([data], allow_nan=True)
    except (TypeError, ValueError) as error:  # no JSON data at all (an object, a cycle)
        raise ShapeError(f"{name}: not JSON data ({error})") from None
    try:
        value: _T = _adapter(cast(Any, cls)).validate_json(text, strict=True)[0]
    except ValidationError as error:
        raise ShapeError(_problems(error, name)) from None
    return value


def _problems(error: ValidationError, name: str) -> str:
    said = [_problem(detail, name) for detail in error.errors(include_url=False)]
    more = f"; and {len(said) - _SAID} more" if len(said) > _SAID else ""
    return "; ".join(said[:_SAID]) + more


def _problem(detail: ErrorDetails, name: str) -> str:
    """One of pydantic's errors as the member it is about and what is wrong: ``Figure.conditions: unknown key x``,
    ``Figure: no metric``, ``Figure.gpu: Input should be a valid integer (a str)``. Its location's first step is
    the one-member tuple's index; a union's members are steps of its location too (``.str``, ``.int``)."""
    steps = detail["loc"][1:]
    kind = detail["type"]
    if kind in ("missing", "unexpected_keyword_argument", "extra_forbidden") and steps:
        what = "no" if kind == "missing" else "unknown key"
        return f"{_path(name, steps[:-1])}: {what} {steps[-1]}"
    return f"{_path(name, steps)}: {detail['msg']} ({_what(detail['input'])})"


def _what(given: object) -> str:
    kind = type(given).__name__
    return "null" if given is None else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _path(name: str, steps: tuple[int | str, ...]) -> str:
    return name + "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in steps)
