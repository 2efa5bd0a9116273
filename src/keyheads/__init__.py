"""keyheads: find, explain and fine-tune the parts of a language model that do arithmetic."""
from .models import HookedModel, load_model  # noqa: E402
from .version import __version__

__all__ = ["HookedModel", "load_model", "__version__"]
