"""Loading a tokenizer by name with a one-line error, and the launcher's check mode.

Every tool that takes a tokenizer name from a user (the data tools, an environment's
config check) loads it here, so a typo reads the same everywhere: the name, the
first line of transformers' reason, and what to give instead.
"""

from __future__ import annotations

from typing import Any

CHECK_CONFIG_ENVIRONMENT = "ATROPOS_CHECK_CONFIG"
"""Set to 1 by `atropos-launch` to run an environment's command as a check only: parse
and resolve its flags, load its tokenizer, exit (launch/checks.py)."""


TOKENIZER_FLAG = "--env.tokenizer_name (atropos-launch: the model)"
"""Where an environment's tokenizer name comes from, for its load error."""


class TokenizerLoadError(ValueError):
    """The tokenizer cannot be loaded; the message says which and why, in one line."""


def load_tokenizer(name: str, given_by: str = "the config") -> Any:
    """`AutoTokenizer.from_pretrained(name)`, or TokenizerLoadError naming `given_by`."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except Exception as error:
        said = str(error).strip()
        first = said.splitlines()[0] if said else ""
        raise TokenizerLoadError(
            f"cannot load the tokenizer {name!r} given by {given_by} ({type(error).__name__}: "
            f"{first}); give a local model directory, or a Hugging Face name that this "
            "machine can download or has in its cache"
        ) from None
