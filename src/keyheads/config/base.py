"""What every command's settings share: the machine fields, the seed, and error messages.

Each command's settings are one pydantic model (keyheads.config.commands), declared by inheriting its
step's settings type (keyheads.section.Section subclasses in each step's settings.py) beside the mixins
here; the fields, types, defaults and `Field(description=...)` are the only definition. pydantic-settings'
CliSettingsSource turns a model into the command's flags (keyheads.commands.flags) and
keyheads.config.run holds the same step types as the sections of `keyheads run`'s YAML. Checks that depend
on this machine (device, dtype, a writable folder) are keyheads.machine functions, called from
validators here, so that one style validates everything before any model loads.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails

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
from ..section import Count, NonNegative, Section, is_bool_for_int

__all__ = ["Count", "NonNegative", "Section", "is_bool_for_int"]  # and the names defined below
S = TypeVar("S", bound=Section)


def _dtype(value: str | None, info: ValidationInfo) -> str | None:
    device = info.data["device"] if "device" in info.data else None  # a section with a device validates it first
    return check_dtype(value, device=device)  # bfloat16 needs a GPU that has it


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


class Batched(Section):
    """The forward batch: how many prompts one forward pass takes (speed and memory, never a result)."""

    batch_size: Count = Field(16, description="prompts per forward pass")


class DataFolder(Section):
    """The benchmark folder, for the steps that read a benchmark."""

    data_dir: str | None = Field(None, description="benchmark folder with gsm8k/, svamp/, ..., mmlu/, csqa/ "
                                                   "(default $KEYHEADS_DATA)")

    @field_validator("data_dir")
    @classmethod
    def _data_dir(cls, v):
        if v is not None and not Path(v).is_dir():
            raise SettingError("data_dir", v, "is not a folder (it should hold gsm8k/, svamp/, ..., mmlu/, csqa/)")
        return v


def take(values: Section, cls: type[S], **given: Any) -> S:
    """The step settings `cls` from the fields of `values` (a command, which inherits `cls` beside its own
    fields) that `cls` declares, and `given` for the rest: how a command hands its step the settings whole."""
    try:
        return cls.model_validate({name: given[name] if name in given else getattr(values, name)
                                   for name in cls.model_fields})
    except ValidationError as err:  # a check across fields (each field was checked with the flags)
        raise setting_error(err, flags=True) from None


# ---- error messages -----------------------------------------------------------------------------
# settings that were renamed: an old config or flag is told the new name
RENAMED = {"operands": "a_range and b_range (--a-range LO,HI --b-range LO,HI)",
            "heldout_seed": "heldout.seed (--heldout.seed)",
            "heldout_fraction": "heldout.train_fraction (--heldout.train-fraction)",
            "patch": "identify: (the identify stage's section; `python tools/upgrade_run_folder.py CONFIG_OR_FOLDER` "
                     "converts an old config or run folder)"}


def _raised(e: ErrorDetails) -> Exception | None:
    """The exception a validator raised: pydantic keeps it as the `error` of a value or assertion error's context."""
    return e["ctx"]["error"] if e["type"] in ("value_error", "assertion_error") and "ctx" in e else None


def _why(e: ErrorDetails) -> str:
    # each of pydantic's error types below comes with the context keys read here (pydantic_core's ErrorType)
    kind, raised = e["type"], _raised(e)
    if isinstance(raised, SettingError) and raised.why:
        return raised.why
    if kind in ("greater_than_equal", "greater_than"):
        sign, bound = (">=", e["ctx"]["ge"]) if kind == "greater_than_equal" else (">", e["ctx"]["gt"])
        return f"must be {'an integer ' if isinstance(bound, int) else ''}{sign} {bound:g}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "must be an integer"
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):  # a model's, a dataclass's
        return "unknown setting"
    if kind == "literal_error":
        return f"must be one of {e['ctx']['expected'].replace(' or ', ', ')}".replace("'", "")
    return e["msg"].removeprefix("Value error, ")


def setting_error(err: ValidationError, flags: bool = False, where: str = "") -> UserError:
    """A SettingError naming every invalid setting: `--flag value: why` (flags) or `key: value given; why`."""
    lines = []
    for e in err.errors():
        raised = _raised(e)
        if isinstance(raised, UserError) and not isinstance(raised, SettingError):
            return raised  # a broken file: its own message names it and says what to do
        loc = [str(p) for p in e["loc"]]
        given = e["input"]
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
