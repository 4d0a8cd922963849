"""Text written where a character can do more than show: names refused at load, and
free text (paths, command lines, messages) made safe for one line of a comment, an XML
document or a terminal."""

from __future__ import annotations

import json
import unicodedata

# Unicode categories no name may hold: controls (C0, C1 with U+0085), format characters
# (bidi overrides, zero-width), surrogates, private use and unassigned code points, line
# and paragraph separators (U+2028, U+2029, which YAML reads as line breaks)
NOT_IN_NAMES = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))


def one_line(text: str) -> str:
    """``text`` with every character that could end a line or drive a terminal (control
    characters, newlines and C1's U+0085 among them; U+2028 and U+2029; format characters
    such as bidi overrides) made a space: for comments and other free text written into
    files (a path, a command line)."""
    return "".join(" " if unicodedata.category(ch) in NOT_IN_NAMES else ch for ch in text)


def _visible(ch: str) -> str:
    """A character written as its escape: ``\\xNN`` (Latin-1), else ``\\uNNNN``."""
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def _xml_char_ok(ch: str) -> bool:
    # XML 1.0, production [2] Char: #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF]
    c = ord(ch)
    return (c in (0x9, 0xA, 0xD) or 0x20 <= c <= 0xD7FF or 0xE000 <= c <= 0xFFFD
            or 0x10000 <= c <= 0x10FFFF)


def xml_safe(text: str) -> str:
    """``text`` with each character XML 1.0 cannot hold (C0 controls but tab and newline, a
    lone surrogate, U+FFFE/U+FFFF; no escape can carry them) written as ``\\xNN`` or
    ``\\uNNNN``, so the document still parses and the character still shows. Markup
    characters are the serializer's to escape (ElementTree, ``html.escape``)."""
    if all(_xml_char_ok(ch) for ch in text):
        return text
    return "".join(ch if _xml_char_ok(ch) else _visible(ch) for ch in text)


_NOT_SHOWN = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


def printable(text: str) -> str:
    """``text`` for a terminal: each control (ESC, which starts a sequence that can retitle
    or clear the terminal; BEL; a C1 control), format, surrogate or separator character
    written as ``\\xNN`` or ``\\uNNNN``; newlines and tabs kept."""
    if text.isprintable():
        return text
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in _NOT_SHOWN else _visible(ch)
                   for ch in text)


def report_safe(text: str) -> str:
    """``text`` for a machine-read report (JUnit XML, an SVG label): every character
    :func:`printable` shows as an escape (C0 and C1 controls with U+0085, bidi overrides
    such as U+202E and other format characters, lone surrogates, U+2028 and U+2029) and
    every one XML 1.0 cannot hold (U+FFFE, U+FFFF) written as ``\\xNN`` or ``\\uNNNN``;
    newlines and tabs kept. A CI page then shows a file name as it is spelled, not
    reordered by a bidi override or split by a separator its renderer honours."""
    return xml_safe(printable(text))


def _is_surrogate(ch: str) -> bool:
    return 0xD800 <= ord(ch) <= 0xDFFF


def json_ready(obj: object) -> object:
    """``obj`` (what ``json.dumps`` takes) with every string, keys included, free of lone
    surrogates (a file name read as bytes that are not UTF-8 holds them; RFC 8259's
    section 8.2 leaves such strings' handling unpredictable, and jq refuses them): each
    is written as its ``\\uNNNN`` escape text, as :func:`printable` shows it on a terminal;
    and every float that is not finite made ``null`` (JSON has no NaN or Infinity;
    ``json.dumps`` writes them bare, which strict readers refuse)."""
    if isinstance(obj, str):
        if any(_is_surrogate(ch) for ch in obj):
            return "".join(_visible(ch) if _is_surrogate(ch) else ch for ch in obj)
        return obj
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {json_ready(k) if isinstance(k, str) else k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    return obj


def json_text(data: object) -> str:
    """``data`` as the JSON every command writes (and every API result's ``to_json``):
    indented, ASCII (so UTF-8 whatever the names hold), and valid for strict readers such
    as jq: a lone surrogate (a file name that is not UTF-8) written as its escape text, a
    NaN or infinity as null (:func:`json_ready`). The common case is dumped once: a
    surrogate shows in the ASCII text as ``\\ud...``, a non-finite number fails
    ``allow_nan=False``."""
    try:
        text = json.dumps(data, indent=2, sort_keys=False, allow_nan=False)
        if "\\ud" not in text:
            return text + "\n"
    except ValueError:
        pass
    return json.dumps(json_ready(data), indent=2, sort_keys=False) + "\n"
