"""The RMB envelope: one immutable value and its JSON wire form.

Standard library only and no I/O, so that the client library, the daemon and tools share it; where orjson is
installed (the daemon's extra) it encodes and parses, with the same bytes and the same results.
Wire rules (see the RMB contract): encoding always writes the 14 keys in a fixed order; decoding matches key
names case-insensitively, ignores unknown keys, gives a missing (or null) key its zero value and rejects a
wrongly typed value with :class:`EnvelopeDecodeError`.
"""

from __future__ import annotations

import base64
import binascii
import json
import operator
import re
from dataclasses import dataclass
from typing import Any

try:
    import orjson as _orjson
except ImportError:  # the client library's install: the standard library does it all
    _orjson = None  # type: ignore[assignment]

PROTOCOL_VERSION = 1
# The lifetime of a request whose ``exp`` is 0.
DEFAULT_EXP_S = 3600
# Integer fields are Go int64s on the wire.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# Wire key -> (attribute, expected kind). Order is the wire order.
_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("ver", "ver", "int"),
    ("uid", "uid", "str"),
    ("cmd", "cmd", "str"),
    ("exp", "exp", "int"),
    ("try", "retries", "int"),
    ("dat", "dat", "str"),
    ("src", "src", "int"),
    ("dst", "dst", "ints"),
    ("ret", "ret", "str"),
    ("shm", "shm", "str"),
    ("now", "now", "int"),
    ("pxy", "pxy", "bool"),
    ("err", "err", "str"),
    ("sig", "sig", "str"),
)
_BY_LOWER_KEY = {key: (attr, kind) for key, attr, kind in _FIELDS}
_ZERO: dict[str, Any] = {"int": 0, "str": "", "ints": (), "bool": False}
_ATTRS = tuple(attr for _key, attr, _kind in _FIELDS)
_set = object.__setattr__
# A key missing on the wire takes its zero value (so a message without "ver" has version 0).
_ZERO_VALUES: dict[str, Any] = {attr: _ZERO[kind] for _key, attr, kind in _FIELDS}


class EnvelopeDecodeError(ValueError):
    """Bytes that are not an envelope. Keeps the raw input so it can be dead-lettered as received."""

    def __init__(self, reason: str, raw: bytes) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


@dataclass(frozen=True, slots=True)
class Envelope:
    """One RMB message. Field names follow the wire keys, except ``retries`` for the wire key ``try``."""

    ver: int = PROTOCOL_VERSION
    uid: str = ""
    cmd: str = ""
    exp: int = 0
    retries: int = 0
    dat: str = ""
    src: int = 0
    dst: tuple[int, ...] = ()
    ret: str = ""
    shm: str = ""
    now: int = 0
    pxy: bool = False
    err: str = ""
    sig: str = ""

    def replace(self, **changes: Any) -> Envelope:
        """A copy with some fields changed (``dst`` may be given as any iterable of ints)."""
        if "dst" in changes:
            changes["dst"] = tuple(changes["dst"])
        unknown = changes.keys() - _ATTRS
        if unknown:
            raise TypeError(f"Envelope has no field {sorted(unknown)[0]!r}")
        # The envelope is copied several times per message: its fields are read in one call and written
        # through their slots (3.3 us here, against 4.9 for dataclasses.replace).
        copy = object.__new__(Envelope)
        for write, value in zip(_SLOT_WRITERS, _read_fields(self), strict=False):
            write(copy, value)
        for attr, value in changes.items():
            _set(copy, attr, value)
        return copy

    @property
    def lifetime_s(self) -> int:
        """``exp``, or the default lifetime when it is 0."""
        return self.exp if self.exp > 0 else DEFAULT_EXP_S

    @property
    def payload(self) -> bytes:
        """``dat`` decoded from base64 (raises ``binascii.Error`` if it is not base64)."""
        return base64.b64decode(self.dat, validate=True)

    def with_payload(self, data: bytes) -> Envelope:
        return self.replace(dat=encode_payload(data))

    def to_wire(self) -> dict[str, Any]:
        """The wire object: all 14 keys, in wire order."""
        out: dict[str, Any] = {}
        for key, attr, _kind in _FIELDS:
            value = getattr(self, attr)
            out[key] = list(value) if isinstance(value, tuple) else value
        return out

    def encode(self) -> bytes:
        wire = self.to_wire()
        if _orjson is not None:
            try:
                return _orjson.dumps(wire)
            except _orjson.JSONEncodeError:
                pass  # what only the standard library writes, or its own error (a lone surrogate)
        return json.dumps(wire, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_wire(cls, obj: Any, raw: bytes = b"") -> Envelope:
        """Build an envelope from a decoded JSON value, with the wire's decoding rules."""
        if type(obj) is dict and len(obj) == len(_FIELDS) and cls is Envelope:
            exact = _from_exact_wire(obj)
            if exact is not None:
                return exact
        if not isinstance(obj, dict):
            raise EnvelopeDecodeError(f"expected a JSON object, got {_json_kind(obj)}", raw)
        values: dict[str, Any] = dict(_ZERO_VALUES)
        for key, value in obj.items():
            field = _BY_LOWER_KEY.get(key.lower()) if isinstance(key, str) else None
            if field is None:
                continue
            attr, kind = field
            values[attr] = _ZERO[kind] if value is None else _check(key, kind, value, raw)
        return cls(**values)

    @classmethod
    def decode(cls, raw: bytes | str) -> Envelope:
        data = raw.encode() if isinstance(raw, str) else raw
        try:
            obj = _parse(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise EnvelopeDecodeError(f"invalid JSON: {exc}", data) from exc
        return cls.from_wire(obj, data)


_read_fields = operator.attrgetter(*_ATTRS)
_SLOT_WRITERS = tuple(getattr(Envelope, attr).__set__ for attr in _ATTRS)
_read_wire_values = operator.itemgetter(*(key for key, _attr, _kind in _FIELDS))


def _from_exact_wire(obj: dict[str, Any]) -> Envelope | None:
    """The envelope of a wire object as envelopes are written (the 14 keys in lower case, no null, every
    value of its kind, in range and ASCII), built without the general rules (6 us here against 15). None
    for any other object, which the general rules then read (and give the same envelope or the error)."""
    try:
        ver, uid, cmd, exp, retries, dat, src, dst, ret, shm, now, pxy, err, sig = _read_wire_values(obj)
    except KeyError:
        return None
    if not (
        type(ver) is type(exp) is type(retries) is type(src) is type(now) is int
        and min(ver, exp, retries, src, now) >= INT64_MIN
        and max(ver, exp, retries, src, now) <= INT64_MAX
        and type(uid) is type(cmd) is type(dat) is type(ret) is type(shm) is type(err) is type(sig) is str
        and uid.isascii() and cmd.isascii() and dat.isascii() and ret.isascii()
        and shm.isascii() and err.isascii() and sig.isascii()
        and type(pxy) is bool
        and type(dst) is list
        and all(type(twin) is int for twin in dst)
    ):  # fmt: skip
        return None
    env = object.__new__(Envelope)
    values = (ver, uid, cmd, exp, retries, dat, src, tuple(dst), ret, shm, now, pxy, err, sig)
    for write, value in zip(_SLOT_WRITERS, values, strict=True):
        write(env, value)
    return env


def _parse(data: bytes) -> Any:
    """``data`` parsed as JSON, as the standard library parses it."""
    if _orjson is not None:
        try:
            obj = _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # what only the standard library reads (lone surrogates, NaN, UTF-16), or its own error
        else:
            # orjson reads an integer beyond 64 bits as a float: such an envelope is refused, in the
            # standard library's words.
            if not _has_float(obj):
                return obj
    return json.loads(data)


def _has_float(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return isinstance(obj, float)
    return any(
        isinstance(value, float) or (isinstance(value, list) and any(isinstance(v, float) for v in value))
        for value in obj.values()
    )


def encode_payload(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode_payload(dat: str) -> bytes:
    """Decode a ``dat`` field; raises ``ValueError`` when it is not standard base64."""
    try:
        return base64.b64decode(dat, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"dat is not base64: {exc}") from exc


def payload_size(dat: str) -> int:
    """Bytes of the payload a base64 ``dat`` carries, without decoding it."""
    if not dat:
        return 0
    return len(dat) * 3 // 4 - (2 if dat.endswith("==") else 1 if dat.endswith("=") else 0)


def _check(key: str, kind: str, value: Any, raw: bytes) -> Any:
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            if not INT64_MIN <= value <= INT64_MAX:
                raise EnvelopeDecodeError(f"field {key!r}: {value} is out of the 64-bit integer range", raw)
            return value
    elif kind == "str":
        if isinstance(value, str):
            return value if value.isascii() else _without_lone_surrogates(value)
    elif kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind == "ints" and isinstance(value, list):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
        raise EnvelopeDecodeError(f"field {key!r}: expected a list of integers", raw)
    expected = {"int": "an integer", "str": "a string", "bool": "a boolean", "ints": "a list of integers"}
    raise EnvelopeDecodeError(f"field {key!r}: expected {expected[kind]}, got {_json_kind(value)}", raw)


def _without_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate (a ``\\ud800`` escape without its pair) replaced by U+FFFD, as Go's
    JSON decoder does: such text could not be written back as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text)
    return text


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"


# The largest payload a site takes (go-rmb's limit), for the daemon, the router and the gateway alike.
DEFAULT_MAX_MESSAGE_BYTES = 12 * 1024 * 1024

# Room for an envelope's fields other than ``dat`` (uid, cmd, ret, sig, the router's headers, ...).
ENVELOPE_FIELDS_SLACK = 64 * 1024


def envelope_size_limit(max_payload_bytes: int) -> int:
    """The largest encoded envelope that carries a payload of ``max_payload_bytes``: base64 turns every 3
    bytes into 4, and the other fields get :data:`ENVELOPE_FIELDS_SLACK`."""
    return 4 * -(-max_payload_bytes // 3) + ENVELOPE_FIELDS_SLACK
