"""keyheads: find, explain and fine-tune the parts of a language model that do arithmetic."""
__version__ = "0.1.0"

from .models import HookedModel, load_model  # noqa: E402

__all__ = ["HookedModel", "load_model", "__version__"]
