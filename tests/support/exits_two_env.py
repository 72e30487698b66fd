"""An environment command that passes atropos-launch's config check, then exits 2 when it
runs, as one whose config changed between the check and the start would (a file gone).

`python tests/support/exits_two_env.py serve ...`: the flags are not read.
"""

from __future__ import annotations

import os
import sys

from atroposlib.utils.tokenizers import CHECK_CONFIG_ENVIRONMENT

if __name__ == "__main__":
    if os.environ.get(CHECK_CONFIG_ENVIRONMENT) == "1":
        sys.exit(0)
    print("exits_two_env serve: --config gone.yaml: no such file", file=sys.stderr)
    sys.exit(2)
