"""The text front end: an LLM's markdown reply in, speakable segments out.

Text arrives whole (``synthesize``, HTTP ``input``) or as deltas split anywhere, even inside
``**``, a number or a URL (Wyoming ``synthesize-chunk``). Two streaming stages make it
speakable; neither ever emits half a markup token:

1. ``MarkdownReader`` (``markdown.py``) turns markdown, and the HTML and SSML markup in it
   (``markup.py``), into speech text, read as a person would read it out: list items,
   headings and table rows end as sentences, markers and tags are not spoken, code blocks
   and emoji are dropped, links are read as their text and bare URLs as their domain.
2. ``Segmenter`` finds sentences with the ``sentence-stream`` package and splits where a
   rule makes a boundary certain but sentence-stream waits: a block end from the reader, an
   all-caps or short capitalised word that is no known abbreviation before ``". "``
   ("called TTS. This", "Yes. I"), a quote or ``¿``/``¡`` opening the next sentence. For
   streamed text the first segment may end at a clause boundary (comma, colon, semicolon,
   dash; CJK ``，：；、``) so that speech starts before the first sentence is complete;
   later segments stay whole sentences. Sentences longer than ``MAX_SEGMENT_SECONDS`` of
   speech are split at clauses or words.

Every segment is capped by ``frame_budget`` codec frames. Works for the ten Qwen3-TTS
languages; Chinese and Japanese need no spaces (their punctuation ends sentences).

This module is the front end's public entry point and holds what is spoken, how long it may
take and where it is cut (``clean_text``, ``estimated_seconds``, ``frame_budget``,
``split_long``, ``Segmenter`` and its sentence and clause rules). Reading markdown is left
to ``markdown.py``, HTML and SSML markup to ``markup.py``, and the script and punctuation
classes both stages decide by to ``writing.py``; ``MarkdownReader`` and
``MAX_SPOKEN_CODE_CHARS`` are still imported from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from sentence_stream import SentenceBoundaryDetector

from .markdown import MAX_SPOKEN_CODE_CHARS as MAX_SPOKEN_CODE_CHARS, MarkdownReader  # (re-exported)
from .writing import CJK_RE, CLOSERS, HAN_KANA_RE, tidy

#: Codec frames per second of audio (Qwen3-TTS-Tokenizer-12Hz: 1920 samples at 24 kHz = 80 ms).
FRAMES_PER_SECOND = 12.5

#: Speaking rates used to bound generation (characters per second of speech). Slow ends of
#: ordinary speech, so real speech ends well inside the budget.
_LATIN_CHARS_PER_SECOND = 12.0
_CJK_CHARS_PER_SECOND = 3.5

#: Longest speech one segment may be estimated to need, in seconds. With the budget below
#: (2x the estimate + 1 s) a segment generates at most ~640 frames, which leaves >1400 of
#: faster-qwen3-tts's default 2048-token static KV cache for the prompt.
MAX_SEGMENT_SECONDS = 25.0

#: Words the first segment of streamed text must hold before it may end at a clause
#: boundary. One word lets "Sure," / "好的，" start speaking at once (as "Sure!" already
#: does through sentence-stream); LLM replies often open with such a word, and the
#: benchmark's streamed text ("Sure, I turned on ...") has no other clause before its end.
FIRST_CLAUSE_MIN_WORDS = 1

#: Capitalised words of up to three letters that end with "." inside a sentence: titles
#: and company suffixes of the model's languages (sentence-stream treats every such short
#: word as a possible abbreviation; the others, "Yes.", "Bob.", "TTS.", end sentences).
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st sr jr mt ft lt co col gen rev sen rep gov sgt inc ltd vs nr hr fr frl "
    "mme sra dra srs ud uds sig av prof str vol".split()
)

_WORD_RE = re.compile(r"[^\W\d_]+")
_SPEAKABLE_RE = re.compile(r"\w")
_CLAUSE_BREAK_RE = re.compile(r"(?<=[,;:，；：、])\s*")

# --- sentence boundaries ---------------------------------------------------------------------
#: Where the segmenter decides about a boundary: whitespace runs, and marks after which CJK
#: text (no spaces) or an unspaced em dash may end a clause or sentence.
_DECISION_RE = re.compile(r"\s+|[，；：、。！？—]")
_CLAUSE_END_RE = re.compile(r"(?:[,;:，；：、—]|\s[-–])$")
_SENTENCE_END_RE = re.compile(rf"[.!?…。！？](?:\s?[{re.escape(CLOSERS)}])*$")
#: A sentence end before a closing quote with a space before it (French "Bonjour. »").
_SPACED_CLOSE_RE = re.compile(rf"[.!?…]\s[{re.escape(CLOSERS)}]+$")
_OPENERS = "¿¡\"“„«‘'("
_NEXT_WORD_RE = re.compile(rf"([{re.escape(_OPENERS)}]*)(\w)")
_LAST_WORD_DOT_RE = re.compile(r"(?<![\w.])([^\W\d_]+)\.$")


def clean_text(text: str) -> str:
    """Make a whole text speakable (``MarkdownReader``), with whitespace collapsed.

    Returns "" when nothing speakable is left (e.g. for "🎉" or a lone code block).
    """
    reader = MarkdownReader()
    speech = tidy(reader.feed(text) + reader.close())
    return speech if _SPEAKABLE_RE.search(speech) else ""


def estimated_seconds(text: str) -> float:
    """Rough upper estimate of the speech duration of ``text``, in seconds."""
    cjk = len(CJK_RE.findall(text))
    return cjk / _CJK_CHARS_PER_SECOND + (len(text) - cjk) / _LATIN_CHARS_PER_SECOND


def frame_budget(text: str) -> int:
    """Most codec frames one segment may generate: twice its estimated length plus 1 s.

    The model sometimes never emits EOS (random weights almost never do), so every
    generation is capped by this ``max_new_tokens``. Units: codec frames (80 ms each).
    """
    return int(2 * FRAMES_PER_SECOND * estimated_seconds(text) + FRAMES_PER_SECOND)


def split_long(sentence: str, max_seconds: float = MAX_SEGMENT_SECONDS) -> list[str]:
    """Split a sentence whose estimated speech exceeds ``max_seconds`` into pieces.

    Breaks at clause punctuation first, then at spaces, then (for unspaced scripts) at
    characters. Every piece is non-empty and no text is lost (pieces joined with single
    spaces equal the input up to whitespace).
    """
    if estimated_seconds(sentence) <= max_seconds:
        return [sentence]
    pieces: list[str] = []
    current = ""
    for unit in _units(sentence, max_seconds):
        candidate = f"{current} {unit}".strip() if current else unit
        if current and estimated_seconds(candidate) > max_seconds:
            pieces.append(current)
            current = unit
        else:
            current = candidate
    if current:
        pieces.append(current)
    return pieces


def _units(sentence: str, max_seconds: float) -> Iterator[str]:
    """Yield the smallest pieces ``split_long`` packs: clauses, else words, else characters."""
    for clause in filter(None, (c.strip() for c in _CLAUSE_BREAK_RE.split(sentence))):
        if estimated_seconds(clause) <= max_seconds:
            yield clause
            continue
        for word in clause.split():
            if estimated_seconds(word) <= max_seconds:
                yield word
                continue
            step = max(1, int(len(word) * max_seconds / estimated_seconds(word)))
            for start in range(0, len(word), step):
                yield word[start : start + step]


class Segmenter:
    """Turn text deltas into speakable segments, as soon as each is complete.

    Deltas may split anywhere. ``add`` returns the segments completed by a delta;
    ``finish`` returns the rest. Each segment is clean speech text (``MarkdownReader``) of
    at most ``MAX_SEGMENT_SECONDS`` estimated speech, with at least one letter or digit.

    Args:
        streamed: the text arrives as it is written (an LLM's deltas): the first segment
            may end at a clause boundary once it holds ``FIRST_CLAUSE_MIN_WORDS`` words.
            False for whole texts: every segment is a sentence.
    """

    def __init__(self, streamed: bool = False) -> None:
        self._reader = MarkdownReader()
        self._detector = SentenceBoundaryDetector()
        self._first_clause = streamed  # may the first segment still end at a clause?
        self._text = ""  # speech text: some context, then what the detector has not had
        self._fed = 0  # characters of _text already given to the detector

    def add(self, delta: str) -> list[str]:
        """Feed one delta; return the segments it completed (possibly none)."""
        return self._push(self._reader.feed(delta), final=False)

    def finish(self) -> list[str]:
        """End the stream; return the segments of the text still buffered."""
        segments = self._push(self._reader.close(), final=True)
        return segments + self._segments([self._detector.finish()])

    def _push(self, speech: str, final: bool) -> list[str]:
        """Mark certain boundaries in new speech text and feed the decided part to sentence-stream."""
        text = self._text = self._text + speech
        pieces: list[str] = []
        start = pos = self._fed
        while match := _DECISION_RE.search(text, pos):
            begin, end = match.span()
            pos = end
            if not match.group().isspace():  # CJK punctuation or an em dash: decide right after it
                if self._clause_ends(end):
                    pieces.append(text[start:end] + "\n\n")
                    start = end
                elif match.group() in "。！？":
                    self._first_clause = False
                continue
            if "\n\n" in match.group():  # the reader's sentence mark
                self._first_clause = False
                continue
            if self._clause_ends(begin):
                pieces.append(text[start:begin] + "\n\n")
                start = end
                continue
            following = _NEXT_WORD_RE.match(text, end)
            if following is None and not final and _only_openers(text[end:]):
                pieces.append(text[start:begin])  # the next word decides: hold the space
                start = begin
                break
            before = text[max(0, begin - 40) : begin]
            if _missed_boundary(before, following):
                pieces.append(text[start:begin] + "\n\n")
                start = end
            elif _SENTENCE_END_RE.search(before):
                self._first_clause = False
        else:
            pieces.append(text[start:])
            start = len(text)
        self._fed = start
        if not self._first_clause and start > 64:  # keep a little context for the rules
            self._text, self._fed = text[start - 64 :], 64
        return self._segments(self._detector.add_chunk("".join(pieces)))

    def _clause_ends(self, end: int) -> bool:
        """True (once) when the first segment of streamed text may end at ``end``: a clause
        mark there, enough words before it, no sentence end and no open bracket before it."""
        if not self._first_clause:
            return False
        head = self._text[:end]
        if not _CLAUSE_END_RE.search(head) or head.count("(") > head.count(")"):
            return False
        words = len(_WORD_RE.findall(HAN_KANA_RE.sub(" ", head))) + len(HAN_KANA_RE.findall(head)) / 2
        if words < FIRST_CLAUSE_MIN_WORDS:
            return False
        self._first_clause = False
        return True

    def _segments(self, sentences: Iterable[str]) -> list[str]:
        out: list[str] = []
        for sentence in sentences:
            text = tidy(sentence)
            if _SPEAKABLE_RE.search(text):
                self._first_clause = False
                out.extend(split_long(text))
        return out


def _only_openers(text: str) -> bool:
    return all(c in _OPENERS for c in text)


def _missed_boundary(before: str, following: re.Match[str] | None) -> bool:
    """A sentence end sentence-stream would not split at: before the space, "." after an
    all-caps word or a short capitalised word that is no known abbreviation ("TTS.",
    "Yes."), or any sentence end followed by an opening quote or ¿/¡; after the space, a
    capital letter."""
    if following is None or not following.group(2).isupper():
        return False
    if (following.group(1) and _SENTENCE_END_RE.search(before)) or _SPACED_CLOSE_RE.search(before):
        return True
    last = _LAST_WORD_DOT_RE.search(before)
    if last is None:
        return False
    word = last.group(1)
    return len(word) >= 2 and word[0].isupper() and (word.isupper() or len(word) <= 3) and word.lower() not in _ABBREVIATIONS
