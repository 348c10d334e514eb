"""The characters of the languages' writing that both text stages decide by.

The markdown reader (``markdown.py``) ends a list item with "。" after Chinese or Japanese
and knows a sentence's end by its punctuation; the segmenter (``text.py``) finds sentence
and clause ends and estimates speech by the same classes. Neither owns them, so they live
here, below both: CJK ranges, sentence-final punctuation, closing quotes and brackets, and
how speech text's whitespace is tidied. What is spoken and where text is cut stay with
``text.py``; what markdown and markup are read as stays with ``markdown.py`` and
``markup.py``.
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


def tidy(text: str) -> str:
    """Collapse whitespace (sentence marks included) and drop spaces before punctuation."""
    return _SPACE_BEFORE_PUNCT_RE.sub(r"\1", _SPACE_RE.sub(" ", text).strip())
