"""How a trace file's values are checked: the pydantic settings its types read under and the value
types several of them share.

Torch-free, like every trace type: the page replays traces without a model.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, PlainValidator
from pydantic_core import PydanticCustomError

# JSON's types as annotated (an int stands for a float, nothing else converts) and no name the type
# does not have
CHECKED = ConfigDict(strict=True, extra="forbid")


def _json_number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PydanticCustomError("number_type", "Input should be a number")
    return v


# a JSON number as written: counts stay ints (the tables show them so), seconds floats
Number = Annotated[int | float, PlainValidator(_json_number)]
