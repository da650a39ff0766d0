"""The project's four top-level packages (`agents`, `benchmarks`, `cory_env`, `cory_common`) and
the other distributions that use the same names: OpenAI's `openai-agents` imports as `agents`,
and TorchRL's wheel installs a `benchmarks` folder.

When Python resolves one of the names to another package, what runs is a mix of two projects
that nobody tested: importing `cory_common` then warns once, in one line per name, naming both
packages and what to do. `python -m cory_common` also names every installed distribution that
claims one of the names (a wheel of this project would write into the same folder as theirs,
and pip does not say so); `make install` runs it.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

NAMES = ("agents", "benchmarks", "cory_env", "cory_common")
HOME = Path(__file__).resolve().parents[1]  # where this project's packages are
ADVICE = "use a virtual environment without it, or run from the repository root"


class PackageClash(UserWarning):
    """A top-level name of this project resolves to another package."""


def where(name: str) -> str | None:
    """Where Python takes the top-level package `name` from (imported or not; None: nowhere)."""
    module = sys.modules.get(name)
    if module is not None:
        file = getattr(module, "__file__", None)
        return file or ", ".join(getattr(module, "__path__", []) or []) or None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return spec.origin if spec.origin not in (None, "namespace") else \
        ", ".join(spec.submodule_search_locations or [])


def ours(location: str | None, name: str) -> bool:
    """Whether a resolved location is this project's package `name`."""
    return location is not None and Path(location.split(", ")[0]).resolve() == \
        (HOME / name / "__init__.py").resolve()


def path_clashes() -> list[str]:
    """One line per top-level name that resolves to a package other than this project's."""
    out = []
    for name in NAMES:
        found = where(name)
        if found is not None and not ours(found, name):
            out.append(f"`{name}` resolves to {found}, not to cory's {HOME / name}: {ADVICE}")
    return out


def claimed_by_others() -> list[str]:
    """One line per top-level name that another installed distribution also claims."""
    import importlib.metadata

    owners = importlib.metadata.packages_distributions()
    out = []
    for name in NAMES:
        others = sorted({d for d in owners.get(name, []) if d.lower() != "cory"})
        if others:
            out.append(f"`{name}` is also installed by {', '.join(others)} (cory's is "
                       f"{HOME / name}): {ADVICE}")
    return out


def warn_on_clash() -> None:
    """Warn once per name that resolves to another package (nothing when none does, nor in
    `python -m cory_common`, which prints them)."""
    if sys.orig_argv[1:3] == ["-m", "cory_common"]:
        return
    for line in path_clashes():
        warnings.warn(line, PackageClash, stacklevel=3)


def report() -> int:
    """Print every clash (by path and by installed distribution); 1 when there is one."""
    lines = list(dict.fromkeys(path_clashes() + claimed_by_others()))
    print("\n".join(f"cory: {line}" for line in lines) or
          f"cory: no other package uses the names {', '.join(NAMES)}")
    return 1 if lines else 0
