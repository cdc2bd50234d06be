"""Typed rows and results to JSON data and back, held to the shape their fields declare.

One codec for everything the controller writes and reads back as JSON (checkpoints, a node's figures): the
field types say what a member may hold, so a saved file or a node's line of another shape is refused with a
:class:`ShapeError` naming the member, never carried on as a silent null or a string where a number belongs.
Supported field types: ``str``, ``int``, ``float`` (an integer is a float), ``bool``, ``None`` and unions of
them, a ``NewType`` of one (read as its type), enums (by value), nested dataclasses, ``list[X]``,
``tuple[X, ...]`` and ``dict[str, X]``; ``Any`` holds whatever JSON holds.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from enum import Enum
from functools import cache
from typing import Any, TypeVar, cast, get_args, get_origin

_T = TypeVar("_T")


class ShapeError(ValueError):
    """Data of another shape than the type it is read as."""


def to_data(value: Any) -> Any:
    """``value`` as JSON data: a dataclass as an object of its fields, an enum as its value, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [to_data(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_data(v) for k, v in value.items()}
    return value


@cache
def field_types(cls: Any) -> dict[str, Any]:
    """The resolved type of each field of the dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def from_data(cls: type[_T], data: Any, where: str = "") -> _T:
    """``data`` read as the dataclass ``cls``: every member one of its fields and of that field's type, every field
    without a default given; anything else raises :class:`ShapeError`."""
    if not isinstance(data, dict):
        raise ShapeError(f"{where or cls.__name__}: a {type(data).__name__}, not object")
    types_ = field_types(cast(Any, cls))
    unknown = sorted(str(key) for key in data if key not in types_)
    if unknown:
        raise ShapeError(f"{where or cls.__name__}: unknown key {', '.join(unknown)}")
    required = [f.name for f in dataclasses.fields(cast(Any, cls)) if _required(f) and f.name not in data]
    if required:
        raise ShapeError(f"{where or cls.__name__}: no {', '.join(required)}")
    values = {key: _read(types_[key], value, f"{where or cls.__name__}.{key}") for key, value in data.items()}
    return cls(**values)


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _read(kind: Any, value: Any, where: str) -> Any:
    """``value`` as ``kind``, or :class:`ShapeError`."""
    origin = get_origin(kind)
    if kind is Any:
        return value
    if isinstance(kind, typing.NewType):  # MaskedText: read as the text it is, masked when it was written
        return _read(kind.__supertype__, value, where)
    if origin in (typing.Union, types.UnionType):
        return _read_union(get_args(kind), value, where)
    if origin in (list, tuple):
        args = get_args(kind)
        if not isinstance(value, list):
            raise ShapeError(f"{where}: a {type(value).__name__}, not list")
        items = [_read(args[0] if args else Any, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin in (dict, Mapping):
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ShapeError(f"{where}: a {type(value).__name__}, not object")
        item = get_args(kind)[1] if get_args(kind) else Any
        return {k: _read(item, v, f"{where}.{k}") for k, v in value.items()}
    return _read_plain(kind, value, where)


def _read_union(kinds: tuple[Any, ...], value: Any, where: str) -> Any:
    if value is None and type(None) in kinds:
        return None
    said: list[str] = []
    for kind in (k for k in kinds if k is not type(None)):
        try:
            return _read(kind, value, where)
        except ShapeError as error:
            said.append(str(error))
    raise ShapeError(said[0] if len(said) == 1 else f"{where}: a {type(value).__name__}, of none of its types")


def _read_plain(kind: Any, value: Any, where: str) -> Any:
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return from_data(kind, value, where)
    if isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(value)
        except ValueError:
            raise ShapeError(f"{where}: {str(value)[:80]!r} is no {kind.__name__}") from None
    if kind is float and type(value) in (int, float):
        return float(value)
    if kind is type(None) and value is None:
        return None
    if kind in (str, int, bool) and type(value) is kind:  # a bool is no int here, an int no bool
        return value
    raise ShapeError(f"{where}: a {type(value).__name__}, not {getattr(kind, '__name__', kind)}")
