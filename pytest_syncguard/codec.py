"""The one codec of the plugin's records: a frozen dataclass to plain JSON data and back, by its type hints.

Every record written to a file or sent between processes (a test's results, a baseline's details, an A/B
report) goes through :func:`encode` and :func:`decode`: a field is written under its own name, nested records
as objects, tuples as lists. A class may name properties in ``DERIVED`` that are written for the file's readers
and ignored when read. :func:`decode` checks every value against its field's type and raises
:class:`CodecError` naming where in the data it went wrong (the data may come from an untrusted file); keys it
does not know are ignored, so that a file written by a newer minor version still reads. No torch here.
"""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, Union

T = TypeVar("T")


class CodecError(ValueError):
    """Data that is not the record it should be; the message says where (``tests[2].comparison.status``)."""


def encode(value: object) -> Any:
    """``value`` as plain JSON data: a dataclass as an object of its fields (and its ``DERIVED`` properties)."""
    if is_dataclass(value) and not isinstance(value, type):
        data = {f.name: encode(getattr(value, f.name)) for f in fields(value)}
        data.update({name: encode(getattr(value, name)) for name in getattr(value, "DERIVED", ())})
        return data
    if isinstance(value, Mapping):
        return {str(key): encode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    if isinstance(value, str):
        return str(value)  # a status (a str subclass) as the plain string it is
    if value is None or isinstance(value, (int, float)):
        return value
    raise TypeError(f"{type(value).__name__} is not a record the codec writes")


#: The most digits of a whole number a document may hold: a float holds up to about 1.8e308, and a number beyond it
#: (``10**400``) is refused where it is read, never left to overflow where it is judged.
MAX_DIGITS = 308


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"a number of {len(text.lstrip('-'))} digits, more than a float holds")
    return int(text)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a document can hold")


def loads(text: str | bytes, *, constants: bool = True) -> Any:
    """JSON ``text`` as plain data, each whole number one a float holds (:class:`ValueError` otherwise); without
    ``constants``, ``NaN`` and ``Infinity`` are refused too."""
    if constants:
        return json.loads(text, parse_int=_bounded_int)
    return json.loads(text, parse_int=_bounded_int, parse_constant=_no_constant)


def read_document(path: Path, schema: str, newest: int, what: str) -> tuple[dict[str, Any], int]:
    """The JSON object of a schema-versioned file and its version (1 to ``newest``); :class:`CodecError` saying
    what is wrong (unreadable, another schema, a newer version) in terms of ``what`` the file should be."""
    try:
        data = loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON, bad UTF-8, a number too long
        raise CodecError(f"not a readable {what} ({type(exc).__name__}: {str(exc)[:200]})") from exc
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise CodecError(f"not a {what} (schema {schema!r} expected)")
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= newest:
        raise CodecError(
            f"{what} schema version {version!r}, this syncguard reads 1 to {newest}: upgrade pytest-syncguard"
        )
    return data, version


def decode(kind: type[T], data: object, where: str = "") -> T:
    """The ``kind`` record that ``data`` (plain JSON data) holds; :class:`CodecError` names what is wrong."""
    return typing.cast(T, _decode(kind, data, where or kind.__name__))


@cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _decode(hint: Any, data: object, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return data
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _decode(options[0], data, where)
        for option in options:
            try:
                return _decode(option, data, where)
            except CodecError:
                continue
        raise CodecError(f"{where}: {data!r} is none of {', '.join(map(_name, options))}")
    if isinstance(hint, type) and is_dataclass(hint):
        return _record(hint, data, where)
    if origin is tuple or origin is list:
        if not isinstance(data, list):
            raise CodecError(f"{where}: a list expected, got {_name(type(data))}")
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(args) != len(data):
                raise CodecError(f"{where}: {len(args)} items expected, got {len(data)}")
            return tuple(_decode(a, item, f"{where}[{i}]") for i, (a, item) in enumerate(zip(args, data, strict=True)))
        items = [_decode(args[0], item, f"{where}[{i}]") for i, item in enumerate(data)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(data, dict):
            raise CodecError(f"{where}: an object expected, got {_name(type(data))}")
        return {str(key): _decode(args[1], item, f"{where}.{key}") for key, item in data.items()}
    return _scalar(hint, data, where)


def _record(kind: type, data: object, where: str) -> Any:
    if not isinstance(data, dict):
        raise CodecError(f"{where}: an object expected, got {_name(type(data))}")
    hints = _hints(kind)
    values = {}
    for f in fields(kind):
        if not f.init:
            continue
        if f.name in data:
            values[f.name] = _decode(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise CodecError(f"{where}: {f.name!r} is missing")
    return kind(**values)


def _scalar(hint: Any, data: object, where: str) -> Any:
    if hint is float:
        if isinstance(data, (int, float)) and not isinstance(data, bool) and math.isfinite(data):
            return float(data)
        raise CodecError(f"{where}: a finite number expected, got {data!r}")
    if hint is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        raise CodecError(f"{where}: a whole number expected, got {data!r}")
    if hint in (str, bool):
        if type(data) is hint:
            return data
        raise CodecError(f"{where}: {_name(hint)} expected, got {data!r}")
    if hint is type(None):
        if data is None:
            return None
        raise CodecError(f"{where}: null expected, got {data!r}")
    raise TypeError(f"{where}: the codec reads no {hint!r}")


def layout(kind: type) -> dict[str, list[tuple[str, str]]]:
    """Every record that a ``kind`` record holds, itself first: its name -> (field, type in words) of each field,
    its ``DERIVED`` properties marked "written only". What the reference page of a file's layout is made from."""
    found: dict[str, list[tuple[str, str]]] = {}
    pending = [kind]
    while pending:
        record = pending.pop(0)
        if record.__name__ in found:
            continue
        hints = _hints(record)
        rows = [(f.name, _words(hints[f.name], pending)) for f in fields(record) if f.init]
        rows += [(name, "written only") for name in getattr(record, "DERIVED", ())]
        found[record.__name__] = rows
    return found


def _words(hint: Any, pending: list[type]) -> str:
    """A type in words; the records it names are queued in ``pending``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and is_dataclass(hint):
        pending.append(hint)
        return hint.__name__
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _words(a, pending) for a in args)
    if (origin is tuple and len(args) == 2 and args[1] is Ellipsis) or origin is list:
        return f"list of {_words(args[0], pending)}"
    if origin is tuple:
        return f"[{', '.join(_words(a, pending) for a in args)}]"
    if origin in (dict, Mapping):
        return f"object of {_words(args[1], pending)}"
    return "anything" if hint is Any else _name(hint)


def _name(kind: Any) -> str:
    return {dict: "object", list: "list", str: "text", float: "number", int: "whole number", bool: "true/false"}.get(
        kind, getattr(kind, "__name__", str(kind))
    )
