"""`python -m hf_vanilla_transformer ...`, the same as the `hf-vanilla-transformer` console script."""

import sys

from .cli import main

sys.exit(main())
