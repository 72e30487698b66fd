"""Write the docs' generated tables from the code that defines them, or check them.

    python scripts/doc_tables.py          # rewrite every stale table
    python scripts/doc_tables.py --check  # exit 1 naming the stale ones (the tests do this)

A generated table sits between `<!-- generated: NAME (scripts/doc_tables.py) -->` and
`<!-- end of generated table -->`; the text around it is the doc's own.
- trainer-flags (docs/trainer.md): `atropos-grpo`'s flags, by `TrainingConfig` section;
- upstream-spellings (docs/compatibility.md): the trainer's other spellings of a flag,
  from each field's `AliasChoices`;
- variables (docs/architecture.md): every `ATROPOS_*` variable (`utils/variables.py`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

END = "<!-- end of generated table -->"


def begin(name: str) -> str:
    return f"<!-- generated: {name} (scripts/doc_tables.py) -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def trainer_flags() -> str:
    from atroposlib.utils.sections import aliases, section_models
    from example_trainer.config import TrainingConfig, build_parser

    actions = {
        flag: action
        for action in build_parser()._actions
        for flag in action.option_strings
        if flag.startswith("--")
    }
    out = []
    for name, section in section_models(TrainingConfig).items():
        out += [f"### `{name}`", "", _cell(section.__doc__ or ""), ""]
        out += ["| flag | default | meaning |", "|---|---|---|"]
        for field_name, field in section.model_fields.items():
            for spelling in [field_name, *aliases(field_name, field)]:
                flag = "--" + spelling.replace("_", "-")
                action = actions[flag]
                if field.is_required():
                    default = "required"
                elif spelling != field_name or field.get_default() is None:
                    default = "-"
                else:
                    default = repr(field.get_default(call_default_factory=True))
                help_text = re.sub(r" \(default: .*\)$", "", action.help or "")
                out.append(f"| `{flag}` | {_cell(default)} | {_cell(help_text)} |")
        out.append("")
    return "\n".join(out).rstrip()


def upstream_spellings() -> str:
    from atroposlib.utils.sections import aliases, iter_leaves
    from example_trainer.config import TrainingConfig

    out = ["| upstream's (or an earlier) spelling | here |", "|---|---|"]
    for leaf in iter_leaves(TrainingConfig):
        for alias in aliases(leaf.name, leaf.field):
            ours = "--" + leaf.name.replace("_", "-")
            out.append(f"| `--{alias.replace('_', '-')}` | `{ours}` (`{leaf.section}`) |")
    return "\n".join(out)


def variables() -> str:
    from atroposlib.utils.variables import SUITE_VARIABLES, VARIABLES

    out = ["| variable | read by | meaning |", "|---|---|---|"]
    out += [
        f"| `{v.name}` | {_cell(v.read_by)} | {_cell(v.meaning)} |"
        for v in (*VARIABLES, *SUITE_VARIABLES)
    ]
    return "\n".join(out)


TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "trainer-flags": ("docs/trainer.md", trainer_flags),
    "upstream-spellings": ("docs/compatibility.md", upstream_spellings),
    "variables": ("docs/architecture.md", variables),
}


def rendered(text: str, name: str, table: str) -> str:
    """`text` with the region of table `name` holding `table`."""
    start = text.find(begin(name))
    end = text.find(END, start)
    if start < 0 or end < 0:
        raise SystemExit(f"no region for {name}: add {begin(name)!r} ... {END!r}")
    head = text[: start + len(begin(name))]
    return f"{head}\n\n{table}\n\n{text[end:]}"


def stale() -> list[tuple[Path, str, str]]:
    """(doc, table name, its new text) for each table whose doc is out of date."""
    found = []
    for name, (doc, make) in TABLES.items():
        path = REPO / doc
        text = path.read_text()
        new = rendered(text, name, make())
        if new != text:
            found.append((path, name, new))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale tables")
    args = parser.parse_args(argv)
    for path, name, new in stale():
        if args.check:
            print(f"{path.relative_to(REPO)}: table {name} is stale; run scripts/doc_tables.py")
        else:
            path.write_text(new)
            print(f"rewrote {name} in {path.relative_to(REPO)}")
    return 1 if args.check and stale() else 0


if __name__ == "__main__":
    raise SystemExit(main())
