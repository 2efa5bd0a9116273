"""What every command's settings share: the machine fields, the seed, and error messages.

Each command's settings are one pydantic model (keyheads.config.commands); its fields, types,
defaults and `Field(description=...)` are the only definition. pydantic-settings'
CliSettingsSource turns a model into the command's flags (keyheads.commands.flags) and
keyheads.config.run composes the same sections into the YAML of `keyheads run`. Checks that depend
on this machine (device, dtype, a writable folder) are keyheads.machine functions, called from
validators here, so that one style validates everything before any model loads.
"""
from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)
from pydantic.fields import FieldInfo

from ..errors import SettingError, UserError
from ..machine import (
    DEVICE_HELP,
    DTYPE_HELP,
    MAX_MEMORY_HELP,
    check_device,
    check_dtype,
    check_max_memory,
    check_writable_dir,
    set_torch_threads,
)

Count = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]


def _dtype(value: str | None, info: ValidationInfo) -> str | None:
    return check_dtype(value, device=info.data.get("device"))  # bfloat16 needs a GPU that has it


def _needs_auto(key: str, value: str, info: ValidationInfo) -> None:
    # a device that failed its own check is not in info.data: that error is the one to show
    if "device" in info.data and info.data["device"] != "auto":
        raise SettingError(key, value, "needs --device auto (a per-device limit and disk offload are for a "
                                       "model that accelerate splits over devices)")


def _max_memory(value: str | None, info: ValidationInfo) -> str | None:
    if value is not None:
        check_max_memory(value, "max_memory")
        _needs_auto("max_memory", value, info)
    return value


def _offload_folder(value: str | None, info: ValidationInfo) -> str | None:
    if value is not None:
        check_writable_dir(value, "offload_folder")
        _needs_auto("offload_folder", value, info)
    return value


# a device or dtype this machine has, checked when a command's or the run's settings are read
Device = Annotated[str | None, AfterValidator(check_device)]
DType = Annotated[str | None, AfterValidator(_dtype)]
# where a model dispatched by accelerate (device auto) may put its weights; declared after `device`
MaxMemory = Annotated[str | None, AfterValidator(_max_memory)]
OffloadFolder = Annotated[str | None, AfterValidator(_offload_folder)]
MAX_MEMORY_DESCRIPTION = (f"with --device auto: the most memory each device may hold of the weights "
                          f"({MAX_MEMORY_HELP}), e.g. cuda:0=20GiB,cpu=60GiB; what does not fit goes to "
                          "--offload-folder")
OFFLOAD_DESCRIPTION = ("with --device auto: a folder for the weights that --max-memory leaves no room for; they are "
                       "read from it during their own layer's forward")


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


def is_bool_for_int(annotation: Any, value: Any) -> bool:
    """Whether `value` is a bool given for an integer setting (which pydantic's lax mode would take as 0 or 1)."""
    if not isinstance(value, bool):
        return False
    kinds = get_args(annotation) or (annotation,)  # int | None -> (int, None); Annotated[int, ...] -> (int, ...)
    kinds += tuple(get_args(k)[0] for k in kinds if get_origin(k) is Annotated)  # Count | None
    return int in kinds and bool not in kinds


class DeviceSettings(Section):
    """Where the model runs and in which dtype: every model-loading command's, and the run config's."""

    device: Device = Field(None, description=f"{DEVICE_HELP} (auto: shard over the GPUs with accelerate); "
                                                    "default: cuda if available, else cpu")
    dtype: DType = Field(None, description=f"{DTYPE_HELP}; default: float32 on CPU, bfloat16 on GPU")
    max_memory: MaxMemory = Field(None, description=MAX_MEMORY_DESCRIPTION)
    offload_folder: OffloadFolder = Field(None, description=OFFLOAD_DESCRIPTION)


class MachineSettings(DeviceSettings):
    """Where and how fast the model runs: every model-loading command's settings of the machine."""

    threads: Count | None = Field(None, description="CPU threads for torch (default: torch's; 1 is often "
                                                       "fastest when other jobs share the cores)")

    def apply(self) -> None:
        """Set torch's thread count (the one setting that acts before a model loads)."""
        if self.threads is not None:
            set_torch_threads(self.threads)


class Quiet(Section):
    """For the commands that show progress bars."""

    quiet: bool = Field(False, description="no progress bars")


def fields_of(cls, exclude: tuple[str, ...] = (), include: tuple[str, ...] = ()) -> dict[str, tuple[Any, FieldInfo]]:
    """A pydantic model's or dataclass's fields, for `create_model`: composed, not declared again."""
    found = getattr(cls, "model_fields", None) or cls.__pydantic_fields__
    return {name: (f.annotation, f) for name, f in found.items()
            if name not in exclude and (not include or name in include)}


def take(values: Any, cls, **given: Any):
    """The step settings `cls` (a pydantic dataclass) from the fields of `values` that it declares, and
    `given` for those a command spells otherwise: how a command, which composes them (`section_of`), hands
    its step the settings whole."""
    try:
        return cls(**{name: given[name] if name in given else getattr(values, name) for name in fields_of(cls)})
    except ValidationError as err:  # a check across fields (each field was checked with the flags)
        raise setting_error(err, flags=True) from None


def section_of(name: str, cls, exclude: tuple[str, ...] = (), include: tuple[str, ...] = ()) -> Any:
    """A Section with (some of) the fields of a pydantic dataclass or model, and their field validators.
    (Typed Any: a class made at run time, which type checkers accept as a base class only so.)"""
    fields: dict[str, Any] = fields_of(cls, exclude, include)
    validators: dict[str, Any] = {}
    for key, dec in cls.__pydantic_decorators__.field_validators.items():
        kept = [f for f in dec.info.fields if f in fields]
        if kept:
            validators[key] = field_validator(*kept, mode=dec.info.mode)(dec.func)
    return create_model(name, __base__=Section, __validators__=validators, **fields)


# ---- error messages -----------------------------------------------------------------------------
# settings that were renamed: an old config or flag is told the new name
RENAMED = {name: "knockout.mean (a run's one knockout mean; --mean of keyheads knockout and eval)"
           for name in ("mean_mode", "knockout_mean")}


def _why(e: Any) -> str:
    ctx = e.get("ctx") or {}
    kind = e["type"]
    if kind == "value_error" and isinstance(ctx.get("error"), SettingError) and ctx["error"].why:
        return ctx["error"].why
    if kind in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        sign = ">=" if kind == "greater_than_equal" else ">"
        return f"must be {'an integer ' if isinstance(bound, int) else ''}{sign} {bound:g}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "must be an integer"
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):  # a model's, a dataclass's
        return "unknown setting"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '').replace(' or ', ', ')}".replace("'", "")
    return e["msg"].removeprefix("Value error, ")


def setting_error(err: ValidationError, flags: bool = False, where: str = "") -> UserError:
    """A SettingError naming every invalid setting: `--flag value: why` (flags) or `key: value given; why`."""
    lines = []
    for e in err.errors():
        raised = (e.get("ctx") or {}).get("error")
        if isinstance(raised, UserError) and not isinstance(raised, SettingError):
            return raised  # a broken file: its own message names it and says what to do
        loc = [str(p) for p in e["loc"]]
        given = e.get("input")
        why = _why(e)
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument") and loc and loc[-1] in RENAMED:
            why += f"; it is now {RENAMED[loc[-1]]}"
        if isinstance(raised, SettingError) and raised.why and isinstance(given, dict) and raised.key not in loc:
            loc, given = loc + [raised.key], raised.value  # a section's check names its own setting
        if not loc or isinstance(given, dict) and e["type"] == "value_error":
            lines.append(why)  # about the whole config; the message names its settings
        elif flags:
            name = ".".join(loc).replace("_", "-")
            lines.append(f"{'-' if len(name) == 1 else '--'}{name} {given}: {why}")  # as pydantic-settings names it
        else:
            lines.append(f"{'.'.join(loc)}: {given!r} given; {why}")
    text = "; ".join(lines)
    return SettingError(f"{where}: {text}" if where else text)
