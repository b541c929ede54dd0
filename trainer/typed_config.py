"""Typed TOML configs on pydantic: sections of documented fields, one-sentence errors, `--set`, TOML out.

Why pydantic in strict mode: a TOML string where a number belongs (`steps = "10"`) is a mistake to name, not a
value to coerce; only what TOML cannot spell is converted (a path from a string, a tuple from an array, one string
for a list of one). Every setting has one dotted name, `section.field`: the key of a config file's [section] table,
the word after `--set` and the line `swarm config show` prints. The trainer's config and the peer's both build on
this module; it sits below both (the trainer package never imports swarm).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import textwrap
import tomllib
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

Sections = dict[str, type["ConfigSection"]]
"""A config's sections by name, in the order `swarm config show` prints them."""

Setting = tuple[str, object, str]
"""(dotted key, value, where it came from: "config file X", "--set", "the command line")."""


class ConfigSection(BaseModel):
    """One [section] of a config: frozen, strict, unknown keys refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


def _one_or_many(value: object) -> object:
    return [value] if isinstance(value, str) else value


ConfigPath = Annotated[Path, Field(strict=False)]
"""A path: TOML and the command line spell it as a string."""

StrTuple = Annotated[tuple[str, ...], BeforeValidator(_one_or_many), Field(strict=False)]
"""Strings: a TOML array of strings, or one string for a list of one."""


def read_toml(path: Path, error: type[Exception]) -> dict:
    """A TOML file's tables, or one sentence naming the file."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise error(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"config file {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"config file {path} is not valid TOML: {exc}") from None


def dotted_keys(sections: Sections) -> list[str]:
    return [f"{name}.{field}" for name, cls in sections.items() for field in cls.model_fields]


def did_you_mean(key: str, sections: Sections) -> str:
    """"; did you mean 'x.y'?" for the closest known key, or "": a field of the key's own section first, then one
    of any section (a bare `lr`, or a field put in the wrong section)."""
    section, _, field = key.rpartition(".")
    own = list(sections[section].model_fields) if section in sections else []
    close = [f"{section}.{word}" for word in difflib.get_close_matches(field, own, n=1, cutoff=0.6)]
    if not close:
        by_field = {name.split(".", 1)[1]: name for name in reversed(dotted_keys(sections))}
        close = [by_field[word] for word in difflib.get_close_matches(field, list(by_field), n=1, cutoff=0.6)]
    if not close and key.partition(".")[0] not in sections:  # a misspelt section rather than a field
        return section_hint(key.partition(".")[0], list(sections))
    if not close:
        return ""
    return f"; did you mean {close[0]!r}?"


def section_hint(name: str, known: list[str]) -> str:
    """"; did you mean [x]?" for the known table name closest to `name` (a misspelt section), or ""."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean [{close[0]}]?" if close else ""


def check_key(key: str, sections: Sections, origin: str, error: type[Exception]) -> tuple[str, str]:
    """(section, field) of a dotted key, or one sentence with the closest known key."""
    section, _, field = key.partition(".")
    if section in sections and field in sections[section].model_fields:
        return section, field
    raise error(f"unknown config key {key!r} in {origin}{did_you_mean(key, sections)}")


def parse_assignment(text: str, sections: Sections, error: type[Exception]) -> Setting:
    """`section.field=value` from `--set`: the value read as a TOML value (number, boolean, string, array,
    inline table); a bare word that is not TOML is taken as a string (`--set peer.run=demo`)."""
    key, equals, raw = text.partition("=")
    key = key.strip()
    if not equals or not key:
        raise error(f"--set takes SECTION.FIELD=VALUE, got {text!r}")
    origin = f"--set {text}"
    check_key(key, sections, origin, error)
    try:
        value = tomllib.loads(f"value = {raw.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value, origin


def build_sections(sections: Sections, settings: Iterable[Setting], error: type[Exception]) -> dict[str, Any]:
    """Every section built from its defaults and `settings` (later ones win), each checked by its model."""
    values: dict[str, dict[str, object]] = {name: {} for name in sections}
    origins: dict[str, str] = {}
    for key, value, origin in settings:
        section, field = check_key(key, sections, origin, error)
        values[section][field] = value
        origins[key] = origin
    built = {}
    for name, cls in sections.items():
        try:
            built[name] = cls.model_validate(values[name])
        except ValidationError as exc:
            raise error(_one_sentence(exc, name, cls, values[name], origins)) from None
    return built


def _one_sentence(exc: ValidationError, section: str, cls: type[ConfigSection], values: dict, origins: dict) -> str:
    first = exc.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    if field not in cls.model_fields:
        return f"config section [{section}]: {first['msg']}"
    key = f"{section}.{field}"
    where = f" in {origins[key]}" if key in origins else ""
    kind = "a finite number" if first["type"] == "finite_number" else kind_of(cls.model_fields[field].annotation)
    return f"config key {key}{where} takes {kind}, got {values.get(field)!r}"


_KINDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string", Path: "a path",
          dict: "a table"}


def kind_of(annotation: object) -> str:
    """What a field takes, in words."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return kind_of(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return " or ".join(kind_of(arg) for arg in get_args(annotation) if arg is not type(None))
    if origin is tuple:
        return "a string or a list of strings"
    return _KINDS.get(origin or annotation, str(annotation))


def toml_value(value: object) -> str:
    """`value` spelled as TOML (the subset a config holds: scalars, paths, arrays, inline tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML spelling for {type(value).__name__}")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def render_section(name: str, section: ConfigSection, width: int = 110) -> str:
    """`[name]` and each field as `key = value`, its description above it as comments (an unset optional field
    is a comment too: TOML has no null)."""
    lines = [f"[{name}]"]
    for field, info in type(section).model_fields.items():
        lines += textwrap.wrap(info.description or "", width, initial_indent="# ", subsequent_indent="# ")
        value = getattr(section, field)
        lines.append(f"# {field} = (unset)" if value is None else f"{field} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def field_help(cls: type[ConfigSection], field: str) -> str:
    """A flag's help: the field's description (its first sentence) and its default."""
    info = cls.model_fields[field]
    first = first_sentence(info.description or "")
    default = info.get_default(call_default_factory=True)
    shown = "unset" if default is None or default == () else toml_value(default)
    return f"{first} (default: {shown})".replace("%", "%%")


def first_sentence(text: str) -> str:
    """Up to the first '.' or ';' that ends a clause outside parentheses (not the one of "e.g.")."""
    depth = 0
    for index, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        ends = char in ".;" and depth == 0 and text[index + 1:index + 2] in (" ", "")
        if ends and not text[:index + 1].endswith(("e.g.", "i.e.")):
            return text[:index]
    return text


def add_field_flag(parser: argparse.ArgumentParser, cls: type[ConfigSection], field: str, *flags: str,
                   **options: Any) -> None:
    """`--field-name` for a config field: its type, its help and default from the field; None when not given,
    so only the flags given override a config file."""
    annotation = cls.model_fields[field].annotation
    base = get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation
    if get_origin(base) is tuple:
        options.setdefault("action", "append")
    elif base in (int, float):
        options.setdefault("type", base)
        options.setdefault("metavar", "N" if base is int else "X")
    elif kind_of(annotation) == "a path":
        options.setdefault("type", Path)
        options.setdefault("metavar", "PATH")
    names = flags or (f"--{field.replace('_', '-')}",)
    parser.add_argument(*names, dest=options.pop("dest", field), help=options.pop("help", field_help(cls, field)),
                        **options)


def add_set_flag(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument("--set", action="append", default=[], dest="set", metavar="SECTION.FIELD=VALUE",
                        help=f"set any config field, the value in TOML (repeatable; e.g. --set {example}); "
                             "`swarm config show` lists every field")
