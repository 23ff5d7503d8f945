"""Message kinds and their schemas.

Theory of operation: every message that may cross the wire is a frozen dataclass
decorated with :func:`message`, which registers ``kind -> class``. The schema of a
kind is the dataclass's fields and their type hints. From the hints we compile,
once per class and lazily (so forward references resolve), two plain functions:

* an encoder turning an instance into CBOR-able data (dataclasses become maps,
  tuples become lists, enums become their values);
* a validator turning decoded CBOR data back into an instance, checking every
  type on the way and raising :class:`SchemaError` with the dotted path of the
  first field that does not fit.

Pure: no trio, no clock, no I/O. The validator never recurses deeper than the
data it is given, and the decoder limits that depth before it gets here.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from corral.transport._errors import SchemaError, UnknownKind

__all__ = [
    "RESERVED_KINDS",
    "check_fields",
    "decode_message",
    "encode_message",
    "message",
    "message_class",
    "message_kind",
    "message_speaker",
    "registered_kinds",
]

#: Kinds the kernel uses for its own envelopes; no message may claim them.
RESERVED_KINDS = frozenset({"reply", "error"})

_T = TypeVar("_T")
_Validator = Callable[[Any, str], Any]
_Encoder = Callable[[Any], Any]

_KIND_ATTR = "__corral_kind__"
_registry: dict[str, type] = {}
# class -> kind of every class registered with @message: message_kind's answer in
# one lookup (reading a class's own __dict__ builds a mapping proxy each time)
_kinds: dict[type, str] = {}
# class -> the field naming the node that speaks the message, for kinds that declare one
_speakers: dict[type, str] = {}
_validators: dict[type, _Validator] = {}
_encoders: dict[type, _Encoder] = {}
# The hot paths of encode_message and decode_message: one dict lookup each
# instead of three (filled on first use, dropped when a kind is registered again).
_message_encoders: dict[type, tuple[str, _Encoder]] = {}
_message_validators: dict[str, _Validator] = {}


def message(kind: str, *, speaker: str | None = None) -> Callable[[type[_T]], type[_T]]:
    """Register a frozen dataclass as the message of ``kind``.

    Args:
        kind: a dotted name such as ``"coordinator.state"``; unique in the process.
        speaker: the field that names the node the message comes from (a node id).
            A message from another node whose speaker field is not the node the
            transport authenticated is refused: a peer may speak only as itself.

    Returns:
        A class decorator that returns the class unchanged (apart from a
        ``__corral_kind__`` attribute).

    Raises:
        TypeError: the class is not a frozen dataclass.
        ValueError: the kind is empty, reserved, or already taken by another class;
            or ``speaker`` names no field of the class.
    """
    if not kind or not isinstance(kind, str):
        raise ValueError("a message kind must be a non-empty string such as 'coordinator.state'")
    if kind in RESERVED_KINDS:
        raise ValueError(f"message kind {kind!r} is reserved for the kernel; pick another name")

    def register(cls: type[_T]) -> type[_T]:
        if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            raise TypeError(
                f"@message({kind!r}) needs a frozen dataclass; "
                f"put @dataclass(frozen=True) under @message on {cls.__qualname__}"
            )
        existing = _registry.get(kind)
        if existing is not None and _qualified(existing) != _qualified(cls):
            raise ValueError(
                f"message kind {kind!r} is already registered by {_qualified(existing)}; "
                f"{_qualified(cls)} must use another kind"
            )
        if speaker is not None and speaker not in {f.name for f in dataclasses.fields(cls)}:
            raise ValueError(
                f"@message({kind!r}, speaker={speaker!r}): {cls.__qualname__} has no field "
                f"{speaker!r}; name the field that holds the sending node's id"
            )
        setattr(cls, _KIND_ATTR, kind)
        _registry[kind] = cls
        _kinds[cls] = kind
        if speaker is None:
            _speakers.pop(cls, None)
        else:
            _speakers[cls] = speaker
        _validators.pop(cls, None)
        _encoders.pop(cls, None)
        _message_encoders.pop(cls, None)
        _message_validators.pop(kind, None)
        return cls

    return register


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def message_kind(obj: object) -> str | None:
    """The kind of a registered message instance or class, or None."""
    cls = obj if isinstance(obj, type) else type(obj)
    return _kinds.get(cls)


def message_speaker(msg: object) -> str | None:
    """The node id ``msg`` says it comes from, for kinds registered with a ``speaker``
    field (None for the others)."""
    field = _speakers.get(type(msg))
    return None if field is None else getattr(msg, field)


def message_class(kind: str) -> type:
    """The class registered for ``kind``.

    Raises:
        UnknownKind: nothing declared this kind.
    """
    try:
        return _registry[kind]
    except KeyError:
        raise UnknownKind(
            f"no message is declared with kind {kind!r}; "
            "decorate its dataclass with @message and import its module on both sides"
        ) from None


def registered_kinds() -> dict[str, type]:
    """A copy of the kind -> class table."""
    return dict(_registry)


def encode_message(msg: object) -> tuple[str, Any]:
    """Turn a registered message into ``(kind, body)`` where body is CBOR-able data.

    Raises:
        SchemaError: ``msg`` is not an instance of a registered message class.
    """
    entry = _message_encoders.get(type(msg))
    if entry is None:
        kind = message_kind(msg)
        if kind is None:
            raise SchemaError(
                f"{type(msg).__qualname__} cannot cross the wire: only @message dataclasses "
                "can; decorate it with @message(kind)"
            )
        entry = _message_encoders[type(msg)] = (kind, _encoder_for(type(msg)))
    kind, encode = entry
    return kind, encode(msg)


def decode_message(kind: str, body: Any) -> object:
    """Check ``body`` against the schema of ``kind`` and build the message.

    Raises:
        UnknownKind: nothing declared this kind.
        SchemaError: the body does not fit the schema (the message names the field).
    """
    validate = _message_validators.get(kind)
    if validate is None:
        validate = _message_validators[kind] = _validator_for(message_class(kind))
    return validate(body, kind)


def check_fields(cls: type[_T], body: Any, where: str) -> _T:
    """Check ``body`` against the fields of the frozen dataclass ``cls`` (registered as
    a message or not) and build it: the validator :func:`decode_message` uses.

    Raises:
        SchemaError: the body does not fit (the message starts with ``where`` and names
            the field).
    """
    built: _T = _validator_for(cls)(body, where)
    return built


def encode_value(value: Any) -> Any:
    """Encode free-form data: dataclasses become maps, enums their values, tuples lists."""
    return _encode_dynamic(value)


# --------------------------------------------------------------------------- compile


def _validator_for(cls: type) -> _Validator:
    fn = _validators.get(cls)
    if fn is None:
        fn = _compile_dataclass_validator(cls)
        _validators[cls] = fn
    return fn


def _encoder_for(cls: type) -> _Encoder:
    fn = _encoders.get(cls)
    if fn is None:
        fn = _compile_dataclass_encoder(cls)
        _encoders[cls] = fn
    return fn


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as exc:
        raise TypeError(
            f"cannot resolve the type hints of {cls.__qualname__}: {exc}; "
            "define every referenced type at module level"
        ) from exc


def _fail(where: str, expected: str, value: Any) -> SchemaError:
    return SchemaError(f"{where}: expected {expected}, got {type(value).__name__}")


def _compile_dataclass_validator(cls: type) -> _Validator:
    # A placeholder first, so self-referencing dataclasses compile without looping.
    holder: list[_Validator] = []

    def lazy(value: Any, where: str) -> Any:
        return holder[0](value, where)

    _validators[cls] = lazy
    hints = _hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    checks = {f.name: _validator_of(hints[f.name]) for f in fields}
    required = frozenset(
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    name = cls.__qualname__
    # Fields of exactly bool, int, str or bytes are checked inline (no call, no path
    # string); a value of another type goes to its validator, which names the field.
    exact = {f.name: hints[f.name] for f in fields if hints[f.name] in (bool, int, str, bytes)}
    count = len(checks)

    def validate(value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise _fail(where, f"a map for {name}", value)
        kwargs = {}
        for key, item in value.items():
            if type(item) is exact.get(key):
                kwargs[key] = item
                continue
            check = checks.get(key)
            if check is None:
                raise SchemaError(f"{where}: {name} has no field {key!r}")
            kwargs[key] = check(item, f"{where}.{key}")
        if len(kwargs) != count:  # only known fields were taken: all are there when equal
            missing = required.difference(kwargs)
            if missing:
                raise SchemaError(f"{where}: {name} is missing {', '.join(sorted(missing))}")
        return cls(**kwargs)

    fast = _fast_validator(cls, fields, hints, checks, validate)
    holder.append(fast)
    _validators[cls] = fast
    return fast


_MISSING = object()
_EXACT = (bool, int, str, bytes)


def _fast_validator(
    cls: type,
    fields: list[dataclasses.Field[Any]],
    hints: dict[str, Any],
    checks: dict[str, _Validator],
    validate: _Validator,
) -> _Validator:
    """``validate`` with a straight path, compiled from the fields, for a map that has
    exactly the fields of ``cls`` and fits: each field read by name, types of exactly
    bool, int, str or bytes compared inline, the others checked by their validators,
    and ``cls`` built with positional arguments. Anything else (a field missing or
    extra, a value that does not fit) goes to ``validate``, which decides and words
    the refusal, so both give the same answer for every input. See :func:`_compiled`.
    """
    namespace: dict[str, Any] = {"cls": cls, "validate": validate, "MISSING": _MISSING}
    reads, fits, checked, args = [], [], [], []
    for i, f in enumerate(fields):
        reads.append(f"        v{i} = value.get({f.name!r}, MISSING)")
        hint = hints[f.name]
        if hint in _EXACT:
            namespace[f"t{i}"] = hint
            fits.append(f"type(v{i}) is t{i}")
        else:
            namespace[f"check{i}"] = checks[f.name]
            fits.append(f"v{i} is not MISSING")
            checked.append(f"                v{i} = check{i}(v{i}, where + {'.' + f.name!r})")
        args.append(f"{f.name}=v{i}" if f.kw_only else f"v{i}")
    build = f"cls({', '.join(args)})"
    lines = [
        "def fast(value, where):",
        f"    if type(value) is dict and len(value) == {len(fields)}:",
        *reads,
        f"        if {' and '.join(fits) or 'True'}:",
    ]
    if checked:
        lines += [
            "            try:",
            *checked,
            "            except Exception:",
            "                pass  # validate words the refusal",
            "            else:",
            f"                return {build}",
        ]
    else:
        lines.append(f"            return {build}")
    lines.append("    return validate(value, where)")
    fast: _Validator = _compiled(lines, namespace)
    return fast


def _compile_dataclass_encoder(cls: type) -> _Encoder:
    holder: list[_Encoder] = []

    def lazy(value: Any) -> Any:
        return holder[0](value)

    _encoders[cls] = lazy
    hints = _hints(cls)
    # One map display with a slot per field: the field's value as it is, or what its
    # type's encoder makes of it.
    namespace: dict[str, Any] = {}
    items = []
    for i, f in enumerate(f for f in dataclasses.fields(cls) if f.init):
        encoder = _encoder_of(hints[f.name])
        if encoder is None:
            items.append(f"{f.name!r}: obj.{f.name}")
        else:
            namespace[f"encode{i}"] = encoder
            items.append(f"{f.name!r}: encode{i}(obj.{f.name})")
    encode: _Encoder = _compiled(
        ["def encode(obj):", f"    return {{{', '.join(items)}}}"], namespace
    )
    holder.append(encode)
    _encoders[cls] = encode
    return encode


def _compiled(lines: list[str], namespace: dict[str, Any]) -> Any:
    """The one function the source ``lines`` define, its globals ``namespace``.

    How the validators and encoders of message classes are compiled, like the
    ``__init__`` :mod:`dataclasses` writes: the source spells only field names
    (identifiers, as dataclasses guarantees), string literals made with ``repr``,
    counts and names of our own; every object it uses is passed in ``namespace``.
    """
    exec("\n".join(lines), namespace)
    name = lines[0].removeprefix("def ").partition("(")[0]
    return namespace[name]


def _is_any(tp: Any) -> bool:
    return tp is Any or tp is object


def _accept_any(value: Any, where: str) -> Any:
    return value


def _exact_type(tp: type) -> _Validator:
    """A value of exactly ``tp``: CBOR keeps bool apart from int, so no subclasses."""
    name = tp.__name__

    def v_exact(value: Any, where: str) -> Any:
        if type(value) is not tp:
            raise _fail(where, name, value)
        return value

    return v_exact


def _validator_of(tp: Any) -> _Validator:
    if _is_any(tp):
        return _accept_any
    if tp is type(None) or tp is None:

        def v_none(value: Any, where: str) -> Any:
            if value is not None:
                raise _fail(where, "null", value)
            return None

        return v_none
    if tp in (bool, int, str, bytes):
        return _exact_type(tp)
    if tp is float:

        def v_float(value: Any, where: str) -> Any:
            t = type(value)
            if t is float:
                return value
            if t is int:
                return float(value)
            raise _fail(where, "float", value)

        return v_float
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        enum_cls = tp

        def v_enum(value: Any, where: str) -> Any:
            try:
                return enum_cls(value)
            except (ValueError, TypeError):
                raise SchemaError(
                    f"{where}: {value!r} is not a value of {enum_cls.__qualname__}"
                ) from None

        return v_enum
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _validator_for(tp)
    if tp in (list, tuple, dict):
        return _validator_of(tp[Any])
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        allowed = args

        def v_literal(value: Any, where: str) -> Any:
            for a in allowed:
                if type(a) is type(value) and a == value:
                    return a
            raise SchemaError(f"{where}: {value!r} is not one of {list(allowed)!r}")

        return v_literal
    if origin is typing.Union or origin is types.UnionType:
        options = [_validator_of(a) for a in args]

        def v_union(value: Any, where: str) -> Any:
            errors = []
            for opt in options:
                try:
                    return opt(value, where)
                except SchemaError as exc:
                    errors.append(str(exc))
            raise SchemaError("; or ".join(errors))

        return v_union
    if origin is list:
        item = _validator_of(args[0]) if args else _accept_any

        def v_list(value: Any, where: str) -> Any:
            if type(value) not in (list, tuple):
                raise _fail(where, "a list", value)
            if item is _accept_any:
                return list(value)
            return [item(x, f"{where}[{i}]") for i, x in enumerate(value)]

        return v_list
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            elem = _validator_of(args[0])

            def v_tuple(value: Any, where: str) -> Any:
                if type(value) not in (list, tuple):
                    raise _fail(where, "a list", value)
                return tuple(elem(x, f"{where}[{i}]") for i, x in enumerate(value))

            return v_tuple
        elems = [_validator_of(a) for a in args]

        def v_fixed_tuple(value: Any, where: str) -> Any:
            if type(value) not in (list, tuple) or len(value) != len(elems):
                raise _fail(where, f"a list of {len(elems)} items", value)
            return tuple(
                e(x, f"{where}[{i}]") for i, (e, x) in enumerate(zip(elems, value, strict=True))
            )

        return v_fixed_tuple
    if origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"dict keys must be str in a message schema, not {args[0]!r}")
        val = _validator_of(args[1]) if args else _accept_any

        def v_dict(value: Any, where: str) -> Any:
            if type(value) is not dict:
                raise _fail(where, "a map", value)
            out = {}
            for k, x in value.items():
                if type(k) is not str:
                    raise _fail(f"{where} key", "str", k)
                out[k] = val(x, f"{where}[{k!r}]")
            return out

        return v_dict
    raise TypeError(
        f"type {tp!r} is not allowed in a message schema; use str, int, float, bool, bytes, "
        "None, X | None, list[T], tuple[T, ...], dict[str, T], Literal, Enum or a frozen dataclass"
    )


def _encoder_of(tp: Any) -> _Encoder | None:
    """An encoder for values of ``tp``, or None when the value is CBOR-able as it is."""
    if _is_any(tp):
        return _encode_dynamic
    if tp in (type(None), None, bool, int, float, str, bytes):
        return None
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _encode_enum
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _encoder_for(tp)
    if tp in (list, tuple, dict):
        return _encoder_of(tp[Any])
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return None
    if origin is typing.Union or origin is types.UnionType:
        if all(_encoder_of(a) is None for a in args):
            return None
        return _encode_dynamic
    if origin in (list, tuple):
        elem_types = (
            args[:1] if (origin is list or (len(args) == 2 and args[1] is Ellipsis)) else args
        )
        if all(_encoder_of(a) is None for a in elem_types):
            return None  # cbor2 writes tuples as arrays already
        return _encode_dynamic
    if origin is dict:
        if args and _encoder_of(args[1]) is None:
            return None
        return _encode_dynamic
    return _encode_dynamic


def _encode_enum(value: Any) -> Any:
    return value.value


def _encode_dynamic(value: Any) -> Any:
    """Encode by looking at the value itself (used for unions and containers of rich types)."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encoder_for(type(value))(value)
    if isinstance(value, list | tuple):
        return [_encode_dynamic(x) for x in value]
    if isinstance(value, dict):
        return {k: _encode_dynamic(x) for k, x in value.items()}
    return value
