"""The JSON codec (pydantic's strict validation of JSON over the dataclasses): what JSON holds reads back as the
fields' types, and any other shape is a ShapeError naming the member, however deep."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NewType

import pytest

from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus, UnreachableCause
from cluster_accept.vocabulary.codec import ShapeError, from_data, to_data

Text = NewType("Text", str)


class Colour(str, Enum):
    RED = "red"


@dataclass(frozen=True)
class Inner:
    x: float
    note: str | None = None


@dataclass
class Outer:
    n: int
    colour: Colour
    pair: tuple[str, ...] = ()
    text: Text = Text("")
    anything: dict[str, Any] = field(default_factory=dict)
    inner: list[Inner] = field(default_factory=list)
    choice: str | int | None = None


GOOD = Outer(3, Colour.RED, ("a", "b"), Text("t"), {"k": [1, None]}, [Inner(1.5), Inner(2.0, "n")], 7)


def test_what_json_holds_reads_back_as_the_fields_types() -> None:
    data = json.loads(json.dumps(to_data(GOOD)))  # through JSON text, as a checkpoint is
    assert data["colour"] == "red" and data["pair"] == ["a", "b"]
    assert from_data(Outer, data) == GOOD
    read = from_data(Outer, {**data, "inner": [{"x": 2}]})
    assert read.inner == [Inner(2.0)] and type(read.inner[0].x) is float  # an integer is a float
    assert math.isnan(from_data(Inner, {"x": math.nan}).x)
    assert math.isnan(to_data(Inner(math.nan))["x"])  # not turned into null


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"n": True}, r"Outer\.n: Input should be a valid integer \(a bool\)"),
        ({"n": 3.0}, r"Outer\.n: .* \(a float\)"),
        ({"n": "3"}, r"Outer\.n: .* \(a str\)"),
        ({"colour": "blue"}, r"Outer\.colour: "),
        ({"pair": "ab"}, r"Outer\.pair: "),
        ({"inner": [{"x": 1}, {"x": True}]}, r"Outer\.inner\[1\]\.x: .* \(a bool\)"),
        ({"inner": [{"x": 1, "y": 2}]}, r"Outer\.inner\[0\]: unknown key y"),
        ({"inner": [{}]}, r"Outer\.inner\[0\]: no x"),
        ({"choice": 1.5}, r"Outer\.choice"),
        ({"text": None}, r"Outer\.text: .* \(null\)"),
        ({"rack": "a"}, r"Outer: unknown key rack"),
    ],
)
def test_another_shape_is_refused_naming_the_member(change: dict[str, Any], said: str) -> None:
    with pytest.raises(ShapeError, match=said):
        from_data(Outer, {**to_data(GOOD), **change})


def test_what_is_no_object_or_no_json_is_refused() -> None:
    with pytest.raises(ShapeError, match=r"^figure: Input should be an object \(a list\)"):
        from_data(Inner, [1], "figure")
    with pytest.raises(ShapeError, match="^Outer: no n; Outer: no colour$"):
        from_data(Outer, {})
    with pytest.raises(ShapeError, match="not JSON data"):
        from_data(Inner, {"x": object()})
    many = {f"k{i}": i for i in range(5)}
    with pytest.raises(ShapeError, match="; and 2 more$"):
        from_data(Inner, {"x": 1, **many})


def test_a_saved_node_result_reads_back_and_a_true_is_no_exit_status() -> None:
    result = NodeResult("n1", NodeStatus.UNREACHABLE, UnreachableCause.AUTH, "refused", [], 1.5)
    done = NodeResult("n2", NodeStatus.OK, commands=[CommandResult("a", 0, "out", "")])
    for saved in (result, done):
        assert from_data(NodeResult, json.loads(json.dumps(to_data(saved)))) == saved
    data = to_data(done)
    data["commands"][0]["exit_code"] = True
    with pytest.raises(ShapeError, match=r"NodeResult\.commands\[0\]\.exit_code"):
        from_data(NodeResult, data)
