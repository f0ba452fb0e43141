"""Collect `test_hf_common.py` only when run.sh asks for it: it sets TRANSFORMERS_TESTS_DIR to the folder where it
assembled transformers' own test machinery (and installs what that needs).

`make test` and CI do not set it: the module is then not collected at all (rather than reported as skipped).
"""

import os
from pathlib import Path

REQUIRED = ("test_modeling_common.py", "generation/test_utils.py", "exporters/test_export.py")

collect_ignore: list[str] = []
TESTS_DIR = os.environ.get("TRANSFORMERS_TESTS_DIR")
if TESTS_DIR is None or not all((Path(TESTS_DIR) / "tests" / name).is_file() for name in REQUIRED):
    collect_ignore.append("test_hf_common.py")
