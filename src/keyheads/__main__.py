"""`python -m keyheads` is the `keyheads` command (useful where the script's folder is not on PATH)."""
import sys

from .cli import main

sys.exit(main())
