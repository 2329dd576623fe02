"""Bounded echoes: what a client sent, quoted back in an error message or a log line at a bounded size.

A status message quotes names the client chose (model, signature, input and output names, labels, datatypes).
Quoted whole, a 20,000-character name makes a gRPC status larger than gRPC's metadata limit (the client then
sees RESOURCE_EXHAUSTED instead of the real answer) and a 1 MB REST error body. Every client value is cut
where the message is built (`clip`, `echo`, `echo_list`), and the transports cap the whole message
(`cap_message`) as a last line of defence.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

ECHO_CHARS = 200  # characters of one client value quoted in a message
ECHO_ITEMS = 5  # items of a client list quoted in a message
MESSAGE_BYTES = 2048  # UTF-8 bytes of a whole status message / error body text (gRPC's metadata limit is 8 KiB)


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` itself when at most `limit` characters, else its first `limit` and `… (N chars)`."""
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


def echo(value, limit: int = ECHO_CHARS) -> str:
    """A client value quoted for a message: a string as `repr` of its first `limit` characters (plus
    `… (N chars)` when cut), anything else as its cut `repr`.
    """
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}… ({len(value)} chars)"
    return clip(repr(value), limit)


def echo_list(values: Iterable, items: int = ECHO_ITEMS, limit: int = ECHO_CHARS) -> str:
    """A client list quoted for a message: its first `items` values (each as `echo`), then `and N more`."""
    values = list(values)
    shown = "[" + ", ".join(echo(v, limit) for v in values[:items]) + "]"
    return shown if len(values) <= items else f"{shown} and {len(values) - items} more"


def cap_message(message: str, limit_bytes: int = MESSAGE_BYTES) -> str:
    """`message` cut to at most `limit_bytes` UTF-8 bytes (never inside a character), then `… (N bytes)`."""
    data = message.encode("utf-8", "replace")
    if len(data) <= limit_bytes:
        return message
    return data[:limit_bytes - 32].decode("utf-8", "ignore") + f"… ({len(data)} bytes)"


def echo_json(value, limit: int = ECHO_CHARS) -> str:
    """Compact JSON of a parsed client value, cut at `limit` characters.

    Written from the front and stopped once `limit` characters are out, so the cost and the depth reached are
    bounded whatever the value's size or nesting (`json.dumps` of the whole value would serialise megabytes to
    show 200 characters, and hit `RecursionError` on a value nested 1,000 deep).
    """
    parts: list[str] = []
    budget = limit

    def put(text: str) -> None:
        nonlocal budget
        parts.append(text[:budget])
        budget -= len(parts[-1])

    def walk(item) -> None:  # depth <= limit: every level writes at least one character
        if budget <= 0:
            return
        if isinstance(item, list):
            put("[")
            for index, element in enumerate(item):
                if budget <= 0:
                    return
                if index:
                    put(",")
                walk(element)
            put("]")
        elif isinstance(item, dict):
            put("{")
            for index, (key, element) in enumerate(item.items()):
                if budget <= 0:
                    return
                put(("," if index else "") + json.dumps(str(key)[:limit], ensure_ascii=False) + ":")
                walk(element)
            put("}")
        elif isinstance(item, str):
            put(json.dumps(item[:limit], ensure_ascii=False))
        elif item is None or type(item) in (bool, int, float):
            put(json.dumps(item)[:limit])
        else:  # a float subclass (a marked literal), or anything else json would not write as is
            put(repr(item)[:limit])

    walk(value)
    return "".join(parts)


def json_kind(value) -> str:
    """The JSON type of a parsed client value, as a message names it to the client (`null`, `boolean`, `number`,
    `string`, `array`, `object`), never Python's (`NoneType`, `dict`).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
