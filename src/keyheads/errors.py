"""Every error that means "the input is wrong", in one place.

The CLI prints a `UserError` as one line (what was wrong and what to do) and exits with status 2;
any other exception is a bug and keeps its traceback. Each subclass names the kind of input.
`UserError` is a `ValueError`, so callers of the Python API can catch either.
"""
from __future__ import annotations


class UserError(ValueError):
    """Bad input: a setting, a file, a model name. The message says what to do."""


class SettingError(UserError):
    """A setting that cannot work: `SettingError(key, value, why)`, or `SettingError(message)`."""

    def __init__(self, key: str, value: object = None, why: str | None = None):
        self.key, self.value, self.why = key, value, why
        if why is None:
            message = key
        elif key.startswith("-"):
            message = f"{key} {value}: {why}"  # as it was typed
        else:
            message = f"{key}: {value!r} given; {why}"
        super().__init__(message)


class BadFile(UserError):
    """A file that is missing, truncated or not of the expected format; the message names it."""


class MissingFile(BadFile, FileNotFoundError):
    """A file the input names that does not exist."""


class DataNotFound(MissingFile):
    """A benchmark is neither in the data folder nor reachable on the hub."""


class ResumeMismatch(UserError):
    """A checkpoint made with other settings than the run that would resume it."""


class MalformedLine(BadFile):
    """A line of a JSONL file that is not a JSON object of the expected keys."""


class NoPairs(BadFile):
    """A pairs file without a single pair."""


class BadSample(UserError):
    """A pair that patching cannot use: its prompts tokenise to different lengths, or its answer is not
    one token after the reference prompt. The message names the file and line."""


class NothingCorrect(UserError):
    """`keep_correct` with a model that predicts no candidate prompt's answer: no pair would be kept."""


class ModelNotFound(UserError):
    """A model name that is neither bundled, a folder, a .gguf file nor a reachable hub id."""


class MissingPackage(UserError, ImportError):
    """An optional package the input needs is not installed; the message gives the pip command."""


class UnsupportedArchitecture(UserError):
    """A model whose config.model_type no family file covers."""


class TemplateError(UserError):
    """A template or pool that cannot be used; the message names the template and the slot."""


class CounterfactualError(UserError):
    """No counterfactual with the reference's token count could be drawn."""


class AnalysisError(UserError):
    """Bad input to an analysis (heads, data, a missing counterfactual)."""
