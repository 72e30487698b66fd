"""Whether a local model directory can be loaded, checked before torch is imported.

A directory without weights (a checkpoint cut short, a folder holding only a copied
config) otherwise fails seconds later, after torch and transformers are imported and
the tokenizer is read, with a traceback that hides the cause; an engine restarted on
such a checkpoint paid that on every try. Hub ids are left to `from_pretrained`:
only a name that exists on disk, or is written as a path, is checked here.
"""

from __future__ import annotations

from pathlib import Path

WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.index.json")
"""What `from_pretrained` (or a peft adapter) can load weights from."""

PATH_PREFIXES = ("/", "./", "../", "~")
"""How a local path is written; `org/name` without them may be a hub id."""


def local_model_problem(model: str) -> str | None:
    """Why the local model `model` cannot load, in one line; None if it may."""
    path = Path(model).expanduser()
    if not path.exists():
        return f"{model}: no such directory" if model.startswith(PATH_PREFIXES) else None
    if not path.is_dir():
        return f"{model}: a file, not a model directory"
    if not any((path / name).is_file() for name in ("config.json", "adapter_config.json")):
        return f"{model}: no config.json, so not a saved model (save_pretrained) directory"
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_FILE_PATTERNS):
        return f"{model}: holds no weights (*.safetensors or *.bin)"
    return None
