"""The one base of the saved results: a pydantic model whose `to_json()` is the JSON on disk.

`to_json()` writes the fields that were set, in the order the type declares them: a result a stage builds
gives the same bytes as the dict it replaced, and a record read from disk is written back as it was. Unknown
keys are an error (a record of another shape fails where it is read) except in the few types that say why
they take free-form keys.
"""
from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    PlainSerializer,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    model_serializer,
    model_validator,
)

from ..heads import Head

R = TypeVar("R", bound="Result")


class Result(BaseModel):
    """A saved result: `to_json()` is its JSON, `from_json()` reads it back (pydantic's ValidationError, a
    ValueError, says which field is wrong)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)

    @classmethod
    def from_json(cls: type[R], data: Any) -> R:
        return cls.model_validate(data)


class AsSaved(Result):
    """A record of free-form keys, a few of them typed, that `to_json()` writes back in the file's order (pydantic
    would put the typed keys first)."""

    model_config = ConfigDict(extra="allow")
    _order: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_order(cls, data: Any, handler: Any) -> Any:
        out = handler(data)
        if isinstance(data, dict):
            out._order = list(data)
        return out

    @model_serializer(mode="wrap")
    def _in_saved_order(self, handler: Any) -> dict[str, Any]:  # nested in another result too
        dumped = handler(self)
        return {k: dumped[k] for k in dict.fromkeys([*self._order, *dumped]) if k in dumped}


def _head(value: Any) -> Head:
    return value if isinstance(value, Head) else Head.from_json(value)


def _number(value: Any) -> int | float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    raise ValueError(f"expected a number, got {value!r}")


# A count or a rate kept as written (an int stays an int, a float a float), anything else an error.
Number = Annotated[int | float, PlainValidator(_number)]

# A head as results store it ({"layer": L, "head": H}), a Head in memory (keyheads.heads reads it).
HeadField = Annotated[Head, PlainValidator(_head), PlainSerializer(Head.to_json)]


def problems(err: ValidationError, limit: int = 3) -> str:
    """The first `limit` problems of a validation error, one line: "key_heads.accuracy_after: Input should be a
    valid number; ..."."""
    parts = [f"{'.'.join(map(str, e['loc'])) or 'the record'}: {e['msg']}" for e in err.errors()[:limit]]
    more = err.error_count() - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
