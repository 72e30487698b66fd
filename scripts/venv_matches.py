"""Exit 0 when the running venv already holds what an install with these inputs gives.

`scripts/test.sh` and `scripts/quickstart.sh` call it before pip, so a current venv
costs a fraction of a second instead of pip's resolution of ~150 packages.
Two checks:
- the stamp written after the last successful install names the same inputs: the
  constraints file, pyproject.toml, the extras and the Python, so a changed pin, a new
  dependency or another extra reinstalls;
- every installed distribution that the constraints file pins has the pinned version,
  so a package upgraded by hand is put back.

    python scripts/venv_matches.py EXTRAS          # exit 0: current, 1: install needed
    python scripts/venv_matches.py EXTRAS --write  # after a successful install
"""

from __future__ import annotations

import hashlib
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "scripts" / "constraints.txt"
# the dev extra also installs the reference implementations into their own folder
REFERENCE_PINS = ROOT / "scripts" / "constraints-reference.txt"
LOCAL_VF_ENV = "vf-mod-arithmetic"
"""environments/vf_mod_arithmetic, which the dev extra installs (editable)."""


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def install_key(extras: str) -> str:
    digest = hashlib.sha256()
    local_vf = ROOT / "environments" / "vf_mod_arithmetic" / "pyproject.toml"
    for path in (CONSTRAINTS, REFERENCE_PINS, ROOT / "pyproject.toml", local_vf):
        digest.update(path.read_bytes())
    digest.update(f"{extras}|{sys.version}|{ROOT}".encode())
    return digest.hexdigest()


def drifted_pins() -> list[str]:
    """'name installed X, pinned Y' for every installed distribution off its pin."""
    pinned = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pinned[canonical(name)] = version.strip()
    drift = []
    for dist in metadata.distributions():
        name = canonical(dist.metadata["Name"] or "")
        want = pinned.get(name)
        # a local build tag (torch's +cpu) is the same release
        if want is not None and dist.version.split("+")[0] != want.split("+")[0]:
            drift.append(f"{name} installed {dist.version}, pinned {want}")
    return drift


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    key = install_key(argv[0])
    # one stamp per set of extras, so the quickstart's install and the tests' do not
    # invalidate each other (with the same pins, more extras only add packages)
    stamp = Path(sys.prefix) / f"atroposlib-install-{argv[0].replace(',', '-')}.stamp"
    if "--write" in argv[1:]:
        stamp.write_text(key + "\n")
        return 0
    if not stamp.exists() or stamp.read_text().strip() != key:
        return 1
    if "dev" in argv[0].split(","):
        for folder in ("reference", "axolotl-plugin"):  # the dev extra's own folders
            if not (Path(sys.prefix) / folder).is_dir():
                print(f"venv lacks .venv/{folder}", file=sys.stderr)
                return 1
        try:  # and the local verifiers environment
            metadata.version(LOCAL_VF_ENV)
        except metadata.PackageNotFoundError:
            print(f"venv lacks {LOCAL_VF_ENV}", file=sys.stderr)
            return 1
    drift = drifted_pins()
    for line in drift:
        print(f"venv drifted from scripts/constraints.txt: {line}", file=sys.stderr)
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
