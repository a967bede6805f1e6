"""Names the field of a GenerateRequest that failed to parse (protobuf only says 'error').

proto3 `string` fields must hold UTF-8; when parsing fails we walk the wire format ourselves
to find which string is bad, so the caller gets INVALID_ARGUMENT naming it.
"""

from __future__ import annotations

# field number -> (name, nested walker or None for a string)
_CHAT_MESSAGE = {1: ("role", None), 2: ("content", None)}
_CHAT = {1: ("messages", _CHAT_MESSAGE)}
_SAMPLING = {7: ("stop", None)}
_REQUEST = {1: ("model", None), 2: ("text", None), 3: ("chat", _CHAT), 5: ("sampling", _SAMPLING)}
_REPEATED = {"messages", "stop"}


def bad_field(data: bytes) -> str:
    """Dotted name of the first field that is not valid UTF-8, or a generic description."""
    try:
        found = _walk(data, _REQUEST, "")
    except (IndexError, ValueError):
        return "request: malformed protobuf message"
    return f"{found}: not valid UTF-8" if found else "request: malformed protobuf message"


def _walk(data: bytes, fields: dict, prefix: str) -> str | None:
    pos, counts = 0, {}
    while pos < len(data):
        key, pos = _varint(data, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(data, pos)
            body, pos = data[pos : pos + size], pos + size
            if num in fields:
                name, nested = fields[num]
                if name in _REPEATED:
                    i = counts.get(name, 0)
                    counts[name] = i + 1
                    name = f"{name}[{i}]"
                path = prefix + name
                if nested is None:
                    try:
                        body.decode("utf-8")
                    except UnicodeDecodeError:
                        return path
                else:
                    found = _walk(body, nested, path + ".")
                    if found:
                        return found
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = data[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7
