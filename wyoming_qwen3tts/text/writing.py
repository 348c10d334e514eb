"""The characters of the languages' writing that both text stages decide by.

The markdown reader (``markdown.py``) ends a list item with "。" after Chinese or Japanese
and knows a sentence's end by its punctuation; the segmenter (``segmenter.py``) finds sentence
and clause ends and estimates speech by the same classes. Neither owns them, so they live
here, below both: CJK ranges, sentence-final punctuation, closing quotes and brackets, how
speech text's whitespace is tidied, and the characters that are no text at all (``SILENT``,
``SPACES``: controls, invisible format characters, U+FFFD, non-characters), which the
reader drops from its input and from decoded entities alike (``markup.INPUT_TEXT``,
``markup.ENTITY_TEXT``), with the terminal escape sequences they may begin
(``drop_escapes``); the request doors make lone surrogates U+FFFD in what they decode
(``replace_lone_surrogates``). What is spoken and where text is cut stay with ``segmenter.py``; what
markdown and markup are read as stays with ``markdown.py`` and ``markup.py``.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: CJK characters and full-width forms, as a character range (a bare URL stops at one).
CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
#: CJK characters, counted at the CJK speaking rate and ending a word where no space does.
CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
#: Scripts whose sentences end with "。" (Chinese and Japanese; Korean uses ".").
HAN_KANA_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_SPACE_RE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+([.,!?;:…。！？，、：；])(?=\s|$)")
#: Closing quotes and brackets, which may stand after a sentence's final punctuation.
CLOSERS = "\"')]}»”’」』）》】"
#: Sentence and clause punctuation: a line that ends with it ends a block, and an item that
#: ends with it gets no period.
TERMINAL = set(".!?…:;。！？：；")
#: Sentence-final punctuation: a finished sentence ends with it (before closers).
FINAL = set(".!?…。！？")


#: Characters that are no text and that no one can say, dropped wherever text comes in (the
#: reader's input and every decoded entity): C0 and C1 controls other than whitespace; the
#: soft hyphen and zero-width characters (a browser shows none of them); U+FEFF (a byte
#: order mark or zero-width no-break space); U+FFFD (what a decoder makes of bytes that were
#: no text); lone surrogates (JSON's "\ud800" decodes to one); and the non-characters
#: (U+FDD0-U+FDEF, and the last two code points of every plane).
SILENT = frozenset(
    [chr(c) for c in [*range(0x09), *range(0x0E, 0x1C), 0x7F, *range(0x80, 0x85), *range(0x86, 0xA0)]]
    + list("\xad\u200b\u200c\u200d\u2060\ufeff\ufffd")
    + [chr(c) for c in range(0xD800, 0xE000)]
    + [chr(c) for c in range(0xFDD0, 0xFDF0)]
    + [chr(plane << 16 | last) for plane in range(17) for last in (0xFFFE, 0xFFFF)]
)
#: Whitespace controls other than tab, newline and carriage return (which markdown reads as
#: such): vertical tab, form feed, the information separators U+001C-U+001F and NEL (U+0085);
#: each becomes a space, as ``str.split`` already treats them.
SPACES = frozenset("\x0b\x0c\x1c\x1d\x1e\x1f\x85")


#: Longest terminal escape sequence dropped whole, in characters (bounds what is held back
#: while one may still be arriving; a longer one loses only its ESC, as ``SILENT``).
MAX_ESCAPE_CHARS = 300
_AT_MOST = f"{{0,{MAX_ESCAPE_CHARS}}}"
#: The starts of the terminal escape sequences of ECMA-48 (colours and cursor moves in an
#: LLM's or a tool's output): a control sequence (CSI: ESC "[" or U+009B, parameter bytes
#: 0x30-0x3F, intermediate bytes 0x20-0x2F); a control string (OSC ESC "]", and DCS, SOS, PM,
#: APC: ESC "P", "X", "^", "_"; any characters but its end); any other escape sequence (ESC,
#: intermediate bytes, the first of them not a space: ESC SP F, S7C1T and its kin, are rare,
#: while a stray ESC before a word is not, and "\x1b alone" would lose its "a"). Only CSI has its 8-bit form here: U+009D and the other 8-bit string
#: openers turn up in text decoded in the wrong code page ("â\x80\x9d" for "”"), and would
#: hide the text after them up to a terminator that never comes.
_ESCAPE_STARTS = (
    rf"(?:\x1b\[|\x9b)[\x30-\x3f]{_AT_MOST}[\x20-\x2f]{_AT_MOST}",
    rf"\x1b[\]PX^_][^\x07\x1b\x9c]{_AT_MOST}",
    rf"\x1b(?:[\x21-\x2f][\x20-\x2f]{_AT_MOST})?",
)
#: A whole terminal escape sequence (each start above and its end: a CSI's final byte
#: 0x40-0x7E; a control string's BEL, ST ESC "\\" or U+009C; another sequence's final byte
#: 0x30-0x7E other than the openers of the two before), or, at the very end of the text,
#: the start of one that may still go on (``held``).
_ESCAPE_RE = re.compile(
    rf"(?P<sequence>{_ESCAPE_STARTS[0]}[\x40-\x7e]"
    rf"|{_ESCAPE_STARTS[1]}(?:\x07|\x1b\\|\x9c)"
    rf"|{_ESCAPE_STARTS[2]}[\x30-\x4f\x51-\x57\x59-\x5a\x5c\x60-\x7e])"
    rf"|(?P<held>(?:{_ESCAPE_STARTS[0]}|{_ESCAPE_STARTS[1]}\x1b?|{_ESCAPE_STARTS[2]})\Z)"
)


def drop_escapes(text: str, final: bool) -> tuple[str, str]:
    """``text`` without its terminal escape sequences ("\\x1b[31mred\\x1b[0m" is "red"), and
    the start of one at its very end that may still go on once more text comes ("\\x1b[3"):
    ``(kept, held)``. Feed ``held + next_delta`` next time, so that a sequence cut across
    deltas is dropped whole, as in the whole text. With ``final`` (the end of the text)
    ``held`` is "": a sequence cut off by the end is dropped. Work: linear in ``text``."""
    if "\x1b" not in text and "\x9b" not in text:
        return text, ""
    kept: list[str] = []
    last, held = 0, ""
    for match in _ESCAPE_RE.finditer(text):
        kept.append(text[last : match.start()])
        last = match.end()
        if match["held"] is not None and not final:
            held = match["held"]
    kept.append(text[last:])
    return "".join(kept), held


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(value: Any) -> Any:
    """A parsed JSON value (``json.loads``) with every surrogate code point in its strings
    and keys replaced by U+FFFD, as a decoder replaces bytes that are no text: JSON's
    "\\ud800" parses to a lone surrogate, which no reply, log or tokenizer can encode. In
    speech text U+FFFD is then dropped (``SILENT``); a voice name keeps it, and is unknown.
    ``value`` itself when it holds none.

    Raises:
        RecursionError: ``value`` is nested too deeply to encode again.
    """
    dumped = json.dumps(value, ensure_ascii=False)
    if not _SURROGATE_RE.search(dumped):
        return value
    return json.loads(_SURROGATE_RE.sub("\ufffd", dumped))


def tidy(text: str) -> str:
    """Collapse whitespace (sentence marks included) and drop spaces before punctuation."""
    return _SPACE_BEFORE_PUNCT_RE.sub(r"\1", _SPACE_RE.sub(" ", text).strip())
