"""Code from outside the package that registers tasks or learners: `--import` and entry points.

    python -m benchmarks.run --import mypkg.learners --import ./my_task.py --methods mine

`load_plugins` imports each module name or `.py` file once (a missing one is an error that
names it); `load_entry_points(group)` loads every installed package's entry points of a group,
`cory.tasks` or `cory.learners` (in a package's pyproject: `[project.entry-points."cory.tasks"]
mytask = "mypkg.tasks"`), when the registry is first read.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import traceback
import warnings
from pathlib import Path

_LOADED: dict[str, object] = {}


def load_plugin(spec: str):
    """Import a module by dotted name or a Python file by path (once); return the module."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--import needs a module name or a .py file, got {spec!r}")
    if spec in _LOADED:
        return _LOADED[spec]
    is_file = spec.endswith(".py") or "/" in spec or "\\" in spec
    if not is_file and not all(part.isidentifier() for part in spec.split(".")):
        what = "a file that is not Python" if Path(spec).is_file() else "not a module name"
        raise ValueError(f"--import {spec!r}: {what}; give a .py file or a dotted module name "
                         f"(mypkg.learners)")
    if is_file:
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"--import {spec!r}: no such file")
        if path.suffix != ".py":
            raise ValueError(f"--import {spec!r}: not a Python file (.py); give a .py file or "
                             f"a dotted module name (mypkg.learners)")
        name = f"cory_plugin_{path.stem}_{abs(hash(str(path))) % 10**8}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[name]
            raise ValueError(plugin_error(spec, err, path)) from None
    else:
        try:
            module = importlib.import_module(spec)
        except ModuleNotFoundError as err:
            if err.name and spec.startswith(err.name):  # the plugin itself is missing
                raise ValueError(f"--import {spec!r}: {err} (is its folder on PYTHONPATH?)"
                                 ) from None
            raise ValueError(plugin_error(spec, err)) from None
        except Exception as err:
            raise ValueError(plugin_error(spec, err)) from None
    _LOADED[spec] = module
    return module


def plugin_error(spec: str, err: BaseException, path: Path | None = None) -> str:
    """What went wrong importing a plugin, in one line: the file and line of the mistake (a
    syntax error's own, else the plugin's deepest frame) and the error."""
    if isinstance(err, SyntaxError):
        where = f"{err.filename}, line {err.lineno}"
        text = f": {err.text.strip()}" if err.text else ""
        return f"--import {spec!r}: {err.msg} ({where}{text})"
    frames = traceback.extract_tb(err.__traceback__)
    mine = [f for f in frames if (Path(f.filename).resolve() == path if path is not None
                                 else not f.filename.startswith("<"))] or frames
    where = f" ({mine[-1].filename}, line {mine[-1].lineno})" if mine else ""
    return f"--import {spec!r} raised {type(err).__name__}: {err}{where}"


def load_plugins(specs) -> None:
    """`load_plugin` each of a list of specs."""
    for spec in specs or ():
        load_plugin(spec)


@functools.cache
def load_entry_points(group: str) -> tuple[str, ...]:
    """Load every installed entry point of `group` (once); return the names loaded."""
    loaded = []
    for ep in importlib.metadata.entry_points(group=group):
        try:
            ep.load()
            loaded.append(ep.name)
        except Exception as err:  # a broken plugin must not break the built-in names
            warnings.warn(f"entry point {ep.name!r} of {group} ({ep.value}) failed to load: "
                          f"{err!r}", RuntimeWarning, stacklevel=2)
    return tuple(loaded)


def check_not_builtin(kind: str, name: str, registry: dict, new, packages: tuple[str, ...]):
    """Refuse to replace a built-in `kind` (one registered from `packages`) with another."""
    old = registry.get(name)
    if old is None or old is new:
        return
    module = getattr(old, "__module__", "") or ""
    if module.split(".")[0] in packages and getattr(new, "__module__", None) != module:
        raise ValueError(f"{kind} name {name!r} is built in ({module}.{old.__qualname__}); "
                         f"register yours under another name")
