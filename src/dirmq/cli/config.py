"""`dirmq serve --config FILE`: every option of `dirmq serve` from a TOML file and from
`DIRMQ_*` environment variables too, and `--print-config`.

Nothing here names an option: the settings are read off the `serve` parser's actions (`layer`
is called once all its options are added), so an option added later is covered at once. For
`--max-body-bytes N`:

    --max-body-bytes 1048576          the command line          wins over
    DIRMQ_MAX_BODY_BYTES=1048576      the environment           wins over
    max-body-bytes = 1048576          the file (--config, or $DIRMQ_CONFIG)   wins over
                                      the option's default

The key is the long option without its dashes (`max_body_bytes` is accepted too: TOML
spells keys either way; both at once is an error); the variable is DIRMQ_ and the key in capitals,
dashes as underscores (`--root` is `DIRMQ_ROOT`, as for every other command). A file or variable
value goes through the option's own `type=` check, as the flag's text would: in the file a
string, an integer or a float (`workers = 2`, `listen = "0.0.0.0:8080"`, `drain-timeout = 2.5`),
a boolean for a switch (`sqs-delay-recently-deleted = true`); in a variable, text (a switch takes
1/0, true/false, yes/no, on/off; an empty variable counts as unset). Relative paths are relative
to the working directory, as on the command line. Errors name the file and the line, or the
variable, and the key.

`--print-config` prints the result as a file `--config` accepts, each line saying where its value
came from; an option whose value is a secret (its name says token, secret, password, ...; not a
FILE holding one) is printed commented out, masked.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dirmq.errors import InvalidArgument
from dirmq.wire.tomlfile import read_toml

ENV_PREFIX = "DIRMQ_"
CONFIG_ENV = "DIRMQ_CONFIG"
OWN_OPTIONS = frozenset({"config", "print-config"})  # about the configuration, not in it
SECRET_WORDS = frozenset({"secret", "token", "password", "passphrase", "key", "keys"})
PATH_METAVARS = frozenset({"FILE", "PATH", "DIR"})
MASK = "********"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
# Options whose None means "not given" although they are in the namespace: the main parser's
# `--root` (before the command) is always there, None when absent.
_NONE_IS_ABSENT = frozenset({"root"})


@dataclass(frozen=True, slots=True)
class Setting:
    """One option of the parser, as the file and the environment name it."""

    key: str  # "max-body-bytes"
    action: argparse.Action
    default: Any

    @property
    def flag(self) -> str:
        return "--" + self.key

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper().replace("-", "_")

    @property
    def switch(self) -> bool:
        """An option that takes no value (store_true and the like): a boolean."""
        return self.action.nargs == 0

    @property
    def many(self) -> bool:
        """An option that takes several values (nargs, or repeated with action=append)."""
        nargs = self.action.nargs
        several = nargs in ("*", "+") or (isinstance(nargs, int) and nargs > 1)
        return several or _appends(self.action)

    @property
    def secret(self) -> bool:
        """Whether its value is a secret itself (not the path of a file that holds one)."""
        words = set(self.key.split("-"))
        if self.action.metavar in PATH_METAVARS or words & {"file", "path", "dir"}:
            return False
        return bool(words & SECRET_WORDS)


def _appends(action: argparse.Action) -> bool:
    return type(action).__name__ in ("_AppendAction", "_ExtendAction")


@dataclass(frozen=True, slots=True)
class Value:
    setting: Setting
    value: Any
    origin: str  # "--listen", "DIRMQ_LISTEN", "dirmq.toml:3" or "default"


def layer(parser: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None) -> None:
    """Call last when building `parser`: its options then leave the namespace untouched when
    not given (so `resolve` knows which were), and `args.config_settings` lists them.
    `defaults`: by key, the defaults of options whose parser default is not the real one."""
    settings: list[Setting] = []
    for action in parser._actions:
        long_names = [o for o in action.option_strings if o.startswith("--")]
        if not long_names or action.dest in (argparse.SUPPRESS, "help"):
            continue
        key = long_names[0][2:]
        if key in OWN_OPTIONS:
            continue
        default = None if action.default is argparse.SUPPRESS else action.default
        default = (defaults or {}).get(key, default)
        settings.append(Setting(key, action, default))
        action.default = argparse.SUPPRESS
    parser.set_defaults(config_settings=tuple(settings))


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> list[Value]:
    """Fill in `args` from the environment, the file and the defaults, wherever the command
    line gave nothing; returns every setting's value and where it came from."""
    settings: tuple[Setting, ...] = args.config_settings
    path = getattr(args, "config", None) or environ.get(CONFIG_ENV) or None
    in_file = read_file(path, settings) if path else {}
    in_env = read_environment(environ, settings)
    values: list[Value] = []
    for setting in settings:
        dest = setting.action.dest
        given = getattr(args, dest, None)
        if hasattr(args, dest) and not (given is None and dest in _NONE_IS_ABSENT):
            flag = next(o for o in setting.action.option_strings if o.startswith("--"))
            value = Value(setting, given, flag)
        elif setting.key in in_env:
            value = in_env[setting.key]
        elif setting.key in in_file:
            value = in_file[setting.key]
        else:
            value = Value(setting, setting.default, "default")
        setattr(args, dest, value.value)
        values.append(value)
    return values


def read_file(path: str, settings: tuple[Setting, ...]) -> dict[str, Value]:
    """The settings in the TOML file at `path`, checked; InvalidArgument names the file, the
    line and the key of the first bad one."""
    text, document = read_toml(path, "config file", InvalidArgument)
    by_key = {s.key: s for s in settings}
    found: dict[str, Value] = {}
    spelled: dict[str, str] = {}
    for key, raw_value in document.items():
        line = _line_of(text, key)
        where = f"{path}:{line}" if line else path
        canonical = key.replace("_", "-")
        setting = by_key.get(canonical)
        if canonical in OWN_OPTIONS:
            raise InvalidArgument(f"{where}: {key!r} is a command-line option, not a setting")
        if setting is None:
            raise InvalidArgument(f"{where}: unknown key {key!r}{_did_you_mean(canonical, by_key)}")
        if canonical in spelled:
            raise InvalidArgument(f"{where}: {key!r} is set twice (as {spelled[canonical]!r} too)")
        spelled[canonical] = key
        try:
            value = _from_toml(setting, raw_value)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where}: {key}: {exc}") from None
        found[canonical] = Value(setting, value, where)
    return found


def read_environment(environ: Mapping[str, str], settings: tuple[Setting, ...]) -> dict[str, Value]:
    """The settings given as DIRMQ_* variables (others are not looked at; empty ones are
    unset); InvalidArgument names the variable."""
    found: dict[str, Value] = {}
    for setting in settings:
        text = environ.get(setting.env)
        if not text:
            continue
        try:
            if setting.switch:
                value = _switch(setting, text)
            elif setting.many:
                value = [_convert(setting, part) for part in text.split()]
            else:
                value = _convert(setting, text)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{setting.env}: {exc}") from None
        found[setting.key] = Value(setting, value, setting.env)
    return found


def _from_toml(setting: Setting, value: object) -> Any:
    if setting.switch:
        if not isinstance(value, bool):
            raise InvalidArgument(f"must be true or false, not {_toml_type(value)}")
        return _switched(setting, value)
    if setting.many:
        if not isinstance(value, list):
            raise InvalidArgument(f"must be an array, not {_toml_type(value)}")
        return [_convert(setting, _scalar_text(item)) for item in value]
    return _convert(setting, _scalar_text(value))


def _scalar_text(value: object) -> str:
    """A TOML string or number as the text the command line would have given."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidArgument(f"must be a string or a number, not {_toml_type(value)}")
    return value if isinstance(value, str) else repr(value)


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    return f"a {type(value).__name__} ({value})"  # dates and times


def _switch(setting: Setting, text: str) -> Any:
    word = text.strip().lower()
    if word in _TRUE:
        return _switched(setting, True)
    if word in _FALSE:
        return _switched(setting, False)
    raise InvalidArgument(f"{text!r} is not one of 1/0, true/false, yes/no, on/off")


def _switched(setting: Setting, on: bool) -> Any:
    """A switch's value when set on (its `const`: True for store_true) or off (its default)."""
    return setting.action.const if on else setting.default


def _convert(setting: Setting, text: str) -> Any:
    """`text` as argparse would take it for this option: its `type=` check, then `choices`."""
    action = setting.action
    convert = action.type
    try:
        value = text if convert is None else convert(text)  # type: ignore[operator]
    except argparse.ArgumentTypeError as exc:
        raise InvalidArgument(str(exc)) from None
    except (TypeError, ValueError):
        name = getattr(convert, "__name__", repr(convert))
        raise InvalidArgument(f"invalid {name} value: {text!r}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(repr, action.choices))
        raise InvalidArgument(f"invalid choice: {text!r} (choose from {choices})")
    return value


def _did_you_mean(key: str, by_key: Mapping[str, Setting]) -> str:
    close = difflib.get_close_matches(key, list(by_key), n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return " (the keys are the long options of `dirmq serve --help`, without the dashes)"


def _line_of(text: str, key: str) -> int | None:
    """The line where `key` is set in TOML `text`: `key = ...`, `"key" = ...`, a dotted
    `key.x = ...`, or a `[key]` table. (tomllib reports no positions but for syntax errors.)"""
    quoted = rf"(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')"
    pattern = re.compile(
        rf"^[ \t]*(?:{quoted}[ \t]*[=.]|\[+[ \t]*{quoted}[ \t]*[\].])", re.MULTILINE
    )
    found = pattern.search(text)
    return None if found is None else text.count("\n", 0, found.start()) + 1


# -- printing ---------------------------------------------------------------------------------
def render(values: list[Value]) -> str:
    """`values` as a TOML file `--config` reads back: one `key = value` line each, saying
    where the value came from; a secret's line, and an unset option's, commented out."""
    lines = [
        "# dirmq serve: the resulting configuration (flags > DIRMQ_* variables > --config file",
        "# > defaults); each line says where its value came from.",
    ]
    seen: set[str] = set()
    for value in values:
        setting = value.setting
        if setting.action.dest in seen:  # a --x / --no-x pair: one line says it
            continue
        seen.add(setting.action.dest)
        origin = f"  # {value.origin}"
        if setting.switch:
            shown: Any = value.value == setting.action.const
        else:
            shown = value.value
        if shown is None:
            lines.append(f"# {setting.key} = (not set){origin}")
        elif setting.secret and value.origin != "default":
            lines.append(f'# {setting.key} = "{MASK}"   (secret, not shown){origin}')
        else:
            lines.append(f"{setting.key} = {_toml_value(shown)}{origin}")
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, but for \\u of control characters,
    which TOML has too)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\u{ord(m.group(0)):04x}", escaped)
    return f'"{escaped}"'
