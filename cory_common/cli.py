"""One command-line generator for every config: each field of a (nested) dataclass is an option
(the benchmark, training, the distributed launcher, play, the demo and the OpenEnv service).

    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    paths = add_options(parser, TrainConfig, TrainConfig())     # --lr, --batch-size, --lora-r...
    cfg = apply(TrainConfig(), {paths[k]: v for k, v in vars(parser.parse_args()).items()})

Naming: a field's option is its name with dashes. The fields of a nested config dataclass
(`ppo`, `sampling`) are options of their own, unprefixed; an optional one (`lora:
LoraSettings | None`) is a `--lora/--no-lora` switch plus prefixed options (`--lora-r`).
Field metadata adjusts a field: `help` (text), `flag` (another name), `cli=False` (no option:
derived or set elsewhere). Two fields with one name are refused when the parser is built.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import re
import typing
from typing import Any


def comma_list(text: str) -> list[str]:
    """'a,b' -> ['a', 'b'] (empty items dropped)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def literal(text: str):
    """A Python literal if the text is one (3, 0.5, True, None), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def key_values(text: str) -> dict:
    """'a=1,b=x' -> {'a': 1, 'b': 'x'}."""
    out = {}
    for item in comma_list(text):
        if "=" not in item:
            raise argparse.ArgumentTypeError(f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = literal(value.strip())
    return out


def _list_of(kind):
    def convert(text: str) -> list:
        try:
            return [kind(x) for x in comma_list(text)]
        except ValueError as err:
            raise argparse.ArgumentTypeError(
                f"expected a comma list of {kind.__name__}, got {text!r}") from err
    convert.__name__ = f"list[{kind.__name__}]"
    return convert


def _optional(kind):
    def convert(text: str):
        return None if text.lower() == "none" else kind(text)
    convert.__name__ = getattr(kind, "__name__", "value")
    return convert


def _unwrap_optional(tp) -> tuple[Any, bool]:
    """(T, True) for T | None, else (tp, False)."""
    args = typing.get_args(tp)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None)), True
    return tp, False


def converter(tp):
    """The argparse `type` of a field's type hint (int, float, str, lists, dicts, optionals)."""
    inner, optional = _unwrap_optional(tp)
    origin = typing.get_origin(inner)
    if origin is list:
        (item,) = typing.get_args(inner) or (str,)
        conv = _list_of(item)
    elif origin is dict or inner is dict:
        conv = key_values
    elif inner in (int, float, str):
        conv = inner
    else:
        raise TypeError(f"no command-line converter for {tp!r}")
    return _optional(conv) if optional else conv


@dataclasses.dataclass(frozen=True)
class Option:
    """One generated option: its flag and the field path it sets."""

    flag: str
    path: tuple[str, ...]
    kind: str  # "value", "bool" or "switch" (an optional dataclass on/off)


def _is_config(tp) -> bool:
    return dataclasses.is_dataclass(tp) and isinstance(tp, type)


def options(cls, skip: tuple[str, ...] = (), prefix: str = "", path: tuple = ()) -> list[Option]:
    """Every option of config class `cls` (see the module docstring); `skip` names paths."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        here = (*path, f.name)
        if f.metadata.get("cli", True) is False or ".".join(here) in skip:
            continue
        tp = hints[f.name]
        inner, optional = _unwrap_optional(tp)
        name = prefix + f.metadata.get("flag", f.name.replace("_", "-"))
        if _is_config(inner):
            if optional:
                out.append(Option(name, here, "switch"))
                out += options(inner, skip, f"{name}-", here)
            else:
                out += options(inner, skip, prefix, here)
        elif inner is bool:
            out.append(Option(name, here, "bool"))
        else:
            out.append(Option(name, here, "value"))
    return out


def field_at(cls, path: tuple[str, ...]) -> tuple[dataclasses.Field, Any]:
    """The dataclass field at `path` under `cls` and its resolved type hint."""
    for i, name in enumerate(path):
        hints = typing.get_type_hints(cls)
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        tp = hints[name]
        if i < len(path) - 1:
            cls = _unwrap_optional(tp)[0]
    return f, tp


def get(cfg, path: tuple[str, ...]):
    """The value at a field path (None below an unset optional config)."""
    for name in path:
        if cfg is None:
            return None
        cfg = getattr(cfg, name)
    return cfg


def add_options(parser: argparse.ArgumentParser, cls, defaults=None,
                skip: tuple[str, ...] = (),
                special: dict[str, dict] | None = None) -> dict[str, tuple[str, ...]]:
    """Add an option per field of `cls` to `parser`; return {dest: field path}.

    `special` maps a dest to the `add_argument` keywords to use instead of the generated ones.
    """
    defaults = cls() if defaults is None else defaults
    dests: dict[str, tuple[str, ...]] = {}
    for opt in options(cls, skip):
        dest = opt.flag.replace("-", "_")
        if dest in dests:
            raise ValueError(f"option --{opt.flag} would set both {'.'.join(dests[dest])} and "
                             f"{'.'.join(opt.path)}; give one a 'flag' in its field metadata")
        dests[dest] = opt.path
        f, tp = field_at(cls, opt.path)
        shown = get(defaults, opt.path) if opt.kind != "switch" else \
            get(defaults, opt.path) is not None
        if shown is None and f.default is not dataclasses.MISSING and f.default is not None:
            shown = f.default  # under an optional config that is off: its own default
        help_ = f"{f.metadata.get('help', '')} (default: {shown!r})".strip()
        if dest in (special or {}):
            parser.add_argument("--" + opt.flag, dest=dest, help=help_, **special[dest])
        elif opt.kind == "value":
            conv = converter(tp)
            parser.add_argument("--" + opt.flag, dest=dest, type=conv, help=help_,
                                metavar=conv.__name__.upper())
        else:
            parser.add_argument("--" + opt.flag, dest=dest, help=help_,
                                action=argparse.BooleanOptionalAction)
    return dests


def parse_into(parser: argparse.ArgumentParser, cls, argv=None,
               special: dict[str, dict] | None = None):
    """(the `cls` config, the namespace): an option per field of `cls` added to `parser`, its
    defaults `cls()`'s, and argv parsed; the parser's other options stay in the namespace."""
    defaults = cls()
    dests = add_options(parser, cls, defaults, special=special)
    parser.set_defaults(**{dest: get(defaults, path) for dest, path in dests.items()})
    args = parser.parse_args(argv)
    return apply(defaults, {path: getattr(args, dest) for dest, path in dests.items()}), args


def apply(cfg, values: dict[tuple[str, ...], Any]):
    """A copy of `cfg` with the value of each field path replaced (nested configs copied).

    Fields are set on copies without re-running `__post_init__`, so settings that must agree
    (a batch and its mini-batch) can change one at a time; validate the result.
    """
    for path, value in sorted(values.items(), key=lambda kv: len(kv[0])):
        cfg = _set(cfg, path, value)
    return cfg


def _set(cfg, path: tuple[str, ...], value):
    name, rest = path[0], path[1:]
    if not rest:
        f, tp = field_at(type(cfg), (name,))
        inner, _ = _unwrap_optional(tp)
        if _is_config(inner) and isinstance(value, bool):  # an optional config's switch
            value = (getattr(cfg, name) or inner()) if value else None
        return _with(cfg, name, value)
    child = getattr(cfg, name)
    if child is None:  # setting a field of an unset optional config turns it on
        child = _unwrap_optional(field_at(type(cfg), (name,))[1])[0]()
    return _with(cfg, name, _set(child, rest, value))


def _with(cfg, name: str, value):
    """A shallow copy of a config with one field set (no __post_init__)."""
    out = copy.copy(cfg)
    object.__setattr__(out, name, value)
    return out


def flatten(cfg, prefix: tuple = ()) -> dict[tuple[str, ...], Any]:
    """{field path: value} of every leaf of a nested config."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out.update(flatten(value, (*prefix, f.name)))
        else:
            out[(*prefix, f.name)] = value
    return out


def from_dict(cls, data: dict):
    """Rebuild a nested config from `dataclasses.asdict` output, naming unknown keys."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} settings {unknown}")
    kwargs = {}
    for key, value in data.items():
        inner, _ = _unwrap_optional(hints[key])
        kwargs[key] = from_dict(inner, value) if _is_config(inner) and isinstance(value, dict) \
            else value
    return cls(**kwargs)


IMPORT_HELP = "module or .py file that registers learners or tasks (repeatable)"


def add_import_option(parser: argparse.ArgumentParser) -> None:
    """Every command line's one --import option: modules or files whose import registers
    learners or tasks, loaded (`cory_common.plugins.load_plugins`) before any name is read."""
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        metavar="MODULE_OR_FILE", help=IMPORT_HELP)


NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class Parser(argparse.ArgumentParser):
    """Every command line's parser: a bad option says what is wrong in one line and where the
    help is, not the whole usage block first; options are never abbreviated."""

    def __init__(self, prog: str, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(prog=prog, **kwargs)
        # a negative number is a value, in scientific notation too (`--lr -1e-4`)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str):
        """Exit 2 with `prog: error: message` and the way to the help."""
        self.exit(2, f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")


def in_flags(message: str, cls) -> str:
    """A validation message with each `Class.field` it names followed by its option, so a
    command-line user reads the flag they typed: "KLConfig.penalty must be ..." becomes
    "--kl-penalty (KLConfig.penalty) must be ..."."""
    for opt in options(cls):
        owner = cls
        for name in opt.path[:-1]:
            owner = _unwrap_optional(typing.get_type_hints(owner)[name])[0]
        key = f"{owner.__name__}.{opt.path[-1]}"
        if key in message and f"--{opt.flag}" not in message:
            message = message.replace(key, f"--{opt.flag} ({key})")
    return message
