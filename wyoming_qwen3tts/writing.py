"""The characters of the languages' writing that both text stages decide by.

The markdown reader (``markdown.py``) ends a list item with "。" after Chinese or Japanese
and knows a sentence's end by its punctuation; the segmenter (``text.py``) finds sentence
and clause ends and estimates speech by the same classes. Neither owns them, so they live
here, below both: CJK ranges, sentence-final punctuation, closing quotes and brackets, how
speech text's whitespace is tidied, and the characters that are no text at all (``SILENT``,
``SPACES``: controls, invisible format characters, U+FFFD, non-characters), which the
reader drops from its input and from decoded entities alike (``markup.INPUT_TEXT``,
``markup.ENTITY_TEXT``). What is spoken and where text is cut stay with ``text.py``; what
markdown and markup are read as stays with ``markdown.py`` and ``markup.py``.
"""

from __future__ import annotations

import re

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


def tidy(text: str) -> str:
    """Collapse whitespace (sentence marks included) and drop spaces before punctuation."""
    return _SPACE_BEFORE_PUNCT_RE.sub(r"\1", _SPACE_RE.sub(" ", text).strip())
