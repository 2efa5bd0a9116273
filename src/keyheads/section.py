"""The one base of every settings type: a step's settings (data/, patching/, analysis/, finetune/,
evaluation/ settings.py), a command's (keyheads.config.commands) and the run's (keyheads.config.run).

A settings type is a pydantic model declared in full in its own module: the commands inherit a step's type
to get its fields as flags, and a run holds the same type as its YAML section, so a field is written once.
Loads without torch.
"""
from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from .errors import SettingError

Count = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]


class Section(BaseModel):
    """A group of settings: unknown keys are errors, and assignments are checked too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_int(cls, value, info: ValidationInfo):
        """True would pass as 1 (pydantic's lax mode), in composed fields too."""
        if info.field_name and is_bool_for_int(cls.model_fields[info.field_name].annotation, value):
            raise SettingError(f"must be an integer, not {value}")
        return value

    def to_json(self) -> dict:
        """The settings as YAML keys and JSON values: what a record saves and `model_validate` reads back."""
        return self.model_dump(mode="json", by_alias=True)


def is_bool_for_int(annotation: Any, value: Any) -> bool:
    """Whether `value` is a bool given for an integer setting (which pydantic's lax mode would take as 0 or 1)."""
    if not isinstance(value, bool):
        return False
    kinds = get_args(annotation) or (annotation,)  # int | None -> (int, None); Annotated[int, ...] -> (int, ...)
    kinds += tuple(get_args(k)[0] for k in kinds if get_origin(k) is Annotated)  # Count | None
    return int in kinds and bool not in kinds
