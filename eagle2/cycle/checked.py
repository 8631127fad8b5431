"""How a trace file's values are checked: the pydantic settings its types read under, the value
types several of them share, and a rule's failure named at its place.

Torch-free, like every trace type: the page replays traces without a model.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, ConfigDict, PlainValidator, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

# JSON's types as annotated (an int stands for a float, nothing else converts) and no name the type
# does not have
CHECKED = ConfigDict(strict=True, extra="forbid")
# the same for the parts of a trace's free-form meta that readers rely on: the names they read are
# typed, any other name is kept as it is
OPEN = ConfigDict(strict=True, extra="allow")

MAX_ACCEPTED = 4096     # tokens accepted in one cycle (the charts allocate per count up to the largest)


def _json_number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PydanticCustomError("number_type", "Input should be a number")
    return v


# a JSON number as written: counts stay ints (the tables show them so), seconds floats
Number = Annotated[int | float, PlainValidator(_json_number)]


def _accepted_count(n: int) -> int:
    if not 0 <= n <= MAX_ACCEPTED:
        raise PydanticCustomError("accepted_range", "an accepted count is out of range ({n}, not 0 to {most})",
                                  {"n": n, "most": MAX_ACCEPTED})
    return n


AcceptedCount = Annotated[int, AfterValidator(_accepted_count)]


def broken(loc: tuple, what: str) -> ValidationError:
    """A rule's failure at `loc` inside the value being checked (pydantic puts the value's own place
    in front), said as `what`: a model validator raises it to name the very field or entry."""
    err = PydanticCustomError("trace_rule", "{what}", {"what": what})
    return ValidationError.from_exception_data("trace", [InitErrorDetails(type=err, loc=loc, input=None)])
