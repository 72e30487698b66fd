"""Loading a tokenizer by name with a one-line error, and the launcher's check mode.

Every tool that takes a tokenizer name from a user (the data tools, an environment's
config check) loads it here, so a typo reads the same everywhere: the name, the
first line of transformers' reason, and what to give instead.

An environment only tokenizes and renders chat templates, which the `tokenizers`
library and jinja do; yet `AutoTokenizer` imports torch on the way (its module loads
the model-config machinery), about 5 s of CPU in every environment process. So when
the tokenizer's own files already settle which class `AutoTokenizer` would build, the
tokenizer is built from that class directly, and torch is never imported. That is the
case of a `tokenizer_config.json` that names transformers' generic `TokenizersBackend`
(what transformers 5 writes for a tokenizer without a class of its own), with no
remote code, for a model type that `AutoTokenizer` does not reroute to a class of its
own. Whether it reroutes is read from `AutoTokenizer`'s own tables, in the installed
transformers' source, without running that module (`auto_tokenizer_tables`). Every
other tokenizer, and any doubt, goes through `AutoTokenizer` as before.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import threading
from pathlib import Path
from typing import Any

CHECK_CONFIG_ENVIRONMENT = "ATROPOS_CHECK_CONFIG"
"""Set by `atropos-launch` to run an environment's command as a check only: parse and
resolve its flags, load its tokenizer (1) or not (`flags`: a dry run of a hub model this
machine does not hold), print `CHECK_REPORT_KEY`'s line, exit (launch/checks.py)."""
CHECK_MODES = ("1", "flags")
CHECK_REPORT_KEY = "atropos_check"
"""The key of the JSON line a checked environment prints: its resolved lengths."""


TOKENIZER_FLAG = "--env.tokenizer_name (atropos-launch: the model)"
"""Where an environment's tokenizer name comes from, for its load error."""

GENERIC_CLASS = "TokenizersBackend"
"""transformers 5's class for a tokenizer that `tokenizer.json` describes whole."""

PARSING = threading.Lock()
"""Two `ast.parse` calls at once, in two threads, can raise SystemError ("AST
constructor recursion depth mismatch") on CPython before 3.11.8 and 3.12.1
(gh-106905): this module parses one at a time."""

# AutoTokenizer's module, by its path in the transformers package: finding it by name
# (importlib.util.find_spec) would import `transformers.models`, whose __init__ scans
# every model's source files (over a second of CPU in each process)
AUTO_TOKENIZER_FILE = ("models", "auto", "tokenization_auto.py")


class TokenizerLoadError(ValueError):
    """The tokenizer cannot be loaded; the message says which and why, in one line."""


def load_tokenizer(name: str, given_by: str = "the config") -> Any:
    """The tokenizer `AutoTokenizer.from_pretrained(name)` gives, or TokenizerLoadError
    naming `given_by`."""
    try:
        tokenizer = load_generic_tokenizer(name)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(name)
        return tokenizer
    except Exception as error:
        said = str(error).strip()
        first = said.splitlines()[0] if said else ""
        raise TokenizerLoadError(
            f"cannot load the tokenizer {name!r} given by {given_by} ({type(error).__name__}: "
            f"{first}); give a local model directory, or a Hugging Face name that this "
            "machine can download or has in its cache"
        ) from None


def load_generic_tokenizer(name: str) -> Any | None:
    """`TokenizersBackend.from_pretrained(name)` where that is what `AutoTokenizer`
    would build (see the module's docstring), else None."""
    try:
        from transformers import TokenizersBackend
        from transformers.utils.hub import cached_file
    except ImportError:  # transformers 4: AutoTokenizer decides
        return None
    tokenizer_config = read_json(cached_file, name, "tokenizer_config.json")
    model_config = read_json(cached_file, name, "config.json")
    if tokenizer_config is None or not builds_generic_class(tokenizer_config, model_config or {}):
        return None
    return TokenizersBackend.from_pretrained(name)


def read_json(cached_file: Any, name: str, filename: str) -> dict[str, Any] | None:
    """`filename` of a local directory or a hub repository (downloaded as transformers
    would), or None where it is missing or not a JSON object."""
    try:
        path = cached_file(name, filename, _raise_exceptions_for_missing_entries=False)
    except OSError:
        return None
    if path is None:
        return None
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def builds_generic_class(tokenizer_config: dict[str, Any], model_config: dict[str, Any]) -> bool:
    """Whether `AutoTokenizer` builds `TokenizersBackend` for these files: the tokenizer
    names it, loads no remote code, and its model type is neither one `AutoTokenizer`
    corrects to a class of its own nor a Mistral one (which may use mistral-common)."""
    if tokenizer_config.get("tokenizer_class") != GENERIC_CLASS or "auto_map" in tokenizer_config:
        return False
    tables = auto_tokenizer_tables()
    if tables is None:
        return False
    classes_by_model_type, rerouted_model_types = tables
    names = {
        str(model_config[key]) for key in ("model_type", "model_name") if model_config.get(key)
    }
    if names & rerouted_model_types:
        return False
    registered = set().union(*(classes_by_model_type.get(n, set()) for n in names))
    return not any("Mistral" in str(class_name) for class_name in registered)


@functools.cache
def auto_tokenizer_tables() -> tuple[dict[str, set[str | None]], frozenset[str]] | None:
    """From the installed transformers' `tokenization_auto.py`, read but not run: each
    model type's tokenizer class names (both arms of a conditional entry), and the
    model types whose hub class it corrects. None where the source is not as expected."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(spec.submodule_search_locations[0]).joinpath(*AUTO_TOKENIZER_FILE)
    if not source.is_file():
        return None
    assigned: dict[str, ast.expr] = {}
    text = source.read_text(encoding="utf-8")
    with PARSING:  # a tokenizer may first load in a thread; see PARSING
        tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name):
                assigned[target.id] = node.value
    try:
        rerouted = frozenset(
            ast.literal_eval(assigned["MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS"])
        )
        classes = {
            ast.literal_eval(model_type): {ast.literal_eval(arm) for arm in arms(value)}
            for model_type, value in mapping_entries(assigned["TOKENIZER_MAPPING_NAMES"])
        }
    except (KeyError, ValueError, TypeError):
        return None
    return classes, rerouted


def mapping_entries(node: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """The (key, value) nodes of `OrderedDict[...]([(key, value), ...])`."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.List)):
        raise ValueError("TOKENIZER_MAPPING_NAMES is not OrderedDict([...])")
    pairs = [entry.elts for entry in node.args[0].elts if isinstance(entry, ast.Tuple)]
    if len(pairs) != len(node.args[0].elts) or any(len(pair) != 2 for pair in pairs):
        raise ValueError("an entry of TOKENIZER_MAPPING_NAMES is not a pair")
    return [(key, value) for key, value in pairs]


def arms(value: ast.expr) -> list[ast.expr]:
    """Every outcome of `A if condition else B` (nested too), or the value itself."""
    if isinstance(value, ast.IfExp):
        return arms(value.body) + arms(value.orelse)
    return [value]


def end_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """The tokens that end a completion: the model's generation config's EOS (one or a
    list) and the tokenizer's. The trainer reads a completion that ends otherwise as cut
    off (its `completions/clipped_ratio`)."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    ids = [*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id]
    return {i for i in ids if i is not None}
