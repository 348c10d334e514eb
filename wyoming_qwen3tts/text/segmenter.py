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
   dash; CJK ``，：；、``) that words follow, so that speech starts before the first sentence
   is complete; later segments stay whole sentences. The asterisks the reader kept are
   hidden from sentence-stream, which drops them. Sentences longer than ``MAX_SEGMENT_SECONDS`` of
   speech are split at clauses or words; run-on text (no sentence end in sight: a long
   reply without full stops, a list of words) is released as it streams, a segment at a
   time, once more than a segment's worth of it waits (``run_on_cut``), at the same places
   as in the whole text. The work per delta is bounded by the delta (amortised): nothing
   is searched again from the start of the text.

Every segment is capped by ``frame_budget`` codec frames, and says a product between numbers
("5 * 3", "2*3") with "×" (``_spoken_operators``). Works for the ten Qwen3-TTS
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
from collections.abc import Iterable

from sentence_stream import SentenceBoundaryDetector

from ..common.audio import FRAMES_PER_SECOND
from ..common.vocabulary import MAX_SEGMENT_SECONDS
from .markdown import MAX_SPOKEN_CODE_CHARS as MAX_SPOKEN_CODE_CHARS, MarkdownReader  # (re-exported)
from .markup import ASTERISK
from .writing import CJK_RE, CLOSERS, HAN_KANA_RE, tidy

#: Speaking rates used to bound generation (characters per second of speech). Slow ends of
#: ordinary speech, so real speech ends well inside the budget.
_LATIN_CHARS_PER_SECOND = 12.0
_CJK_CHARS_PER_SECOND = 3.5

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

#: A letter of a spaced script, and the start of a word of one (a letter after no such
#: letter): counted with the text before as context, so the counts of consecutive stretches
#: add up to the count of their whole. Chinese and Japanese characters count half a word each.
_SPACED_LETTER = r"[^\W\d_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
_WORD_START_RE = re.compile(rf"(?<!{_SPACED_LETTER}){_SPACED_LETTER}")
_SPEAKABLE_RE = re.compile(r"\w")

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


# --- run-on text ------------------------------------------------------------------------------
#: ``estimated_seconds`` in whole ticks (1/84 s: a Latin character is 7, a CJK one 24), so that
#: sums over stretches of text are exact however the text was cut.
_TICKS_PER_SECOND = 84
_LATIN_TICKS = round(_TICKS_PER_SECOND / _LATIN_CHARS_PER_SECOND)
_CJK_TICKS = round(_TICKS_PER_SECOND / _CJK_CHARS_PER_SECOND)
assert (_LATIN_TICKS / _TICKS_PER_SECOND, _CJK_TICKS / _TICKS_PER_SECOND) == (
    1 / _LATIN_CHARS_PER_SECOND,
    1 / _CJK_CHARS_PER_SECOND,
), "speaking rates that are no whole number of ticks"
_MAX_SEGMENT_TICKS = round(MAX_SEGMENT_SECONDS * _TICKS_PER_SECOND)
#: Characters of speech text between the points where the segmenter checks for run-on text
#: that may have to be released, where no space or clause mark comes sooner (a long word,
#: Chinese without punctuation). Bounds what sentence-stream holds to a segment and this.
RUN_ON_CHECK_CHARS = 32
#: Speech after a clause mark where the first segment of streamed text may end: a letter or
#: digit after fewer than ``RUN_ON_CHECK_CHARS`` other characters (spaces not counted), or
#: that many of them. Symbols up to the text's end ("Rating: *", "好的，*") stay with the
#: clause: alone they would be a segment with nothing to say, and dropped.
_SPEECH_FOLLOWS_RE = re.compile(
    rf"(?:\s*[^\w\s]){{0,{RUN_ON_CHECK_CHARS - 1}}}\s*\w|(?:\s*[^\w\s]){{{RUN_ON_CHECK_CHARS}}}"
)
#: Where run-on text may be cut, best first: after clause or sentence punctuation (and any
#: closing quotes) followed by a space, after a spaced dash, after an em dash or CJK
#: punctuation; then at the last space; then between CJK characters; else at a character.
_RUN_ON_CLAUSE_RE = re.compile(
    rf"(?:[,;:.!?…]|(?<=\s)[-–])[{re.escape(CLOSERS)}]*(?=\s)"
    rf"|[—，；：、。！？][{re.escape(CLOSERS)}]*"
)


# --- operators --------------------------------------------------------------------------------
#: A "*" that the reader left in the speech text (no emphasis: "5 * 3", "2*3") between numbers
#: or brackets, spaced alike on both sides: a product, spoken as "×". The number after it may
#: have a sign or be an amount ("-5 * -3", "5 * $3"), as the one before it may ("$5 * 3").
_OPERAND = r"[-+−]?[$€£¥₹]?[\d(]"
_PRODUCT_RE = re.compile(rf"(?<=[\d)])\*(?={_OPERAND})|(?<=[\d)] )\*(?= {_OPERAND})")
#: The segmenter's speech text while sentence-stream holds it: "*" as ``markup.ASTERISK``
#: (sentence-stream drops asterisks around words, and at a line's start), and back.
_HIDE_ASTERISKS = str.maketrans("*", ASTERISK)
_SHOW_ASTERISKS = str.maketrans(ASTERISK, "*")


def _spoken_operators(speech: str) -> str:
    """Speech text with its products spoken: a "*" between numbers (or a bracket and a
    number), with a space on both sides or on neither, becomes the multiplication sign
    ("5 * 3 * 4" -> "5 × 3 × 4", "2*3" -> "2×3", "(1+2)*3" -> "(1+2)×3", "-5 * -3" -> "-5 × -3"),
    which the model reads as "times" in the sentence's own language ("mal", "fois", "乘");
    an asterisk is no word, and a model trained on transcripts of speech may skip it. Other
    asterisks the reader kept ("x * y", a footnote's "*", "5* by users") are left for the model to read in context."""
    return _PRODUCT_RE.sub("×", speech)


def clean_text(text: str) -> str:
    """Make a whole text speakable (``MarkdownReader``, ``_spoken_operators``), with
    whitespace collapsed.

    Returns "" when nothing speakable is left (e.g. for "🎉" or a lone code block).
    """
    reader = MarkdownReader()
    speech = _spoken_operators(tidy(reader.feed(text) + reader.close()))
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
    """Split a sentence whose estimated speech exceeds ``max_seconds`` into pieces, cut
    where run-on text is (``run_on_cut``): at the last clause mark that fits, else the last
    word boundary, else (one long word) at a character.

    Every piece is non-empty and no text is lost or changed (pieces are slices of the
    sentence, stripped: joined with single spaces they equal it up to whitespace).
    """
    pieces: list[str] = []
    rest = sentence.strip()
    while rest and _spoken_ticks(rest) > max_seconds * _TICKS_PER_SECOND:
        cut = run_on_cut(rest, max_seconds)
        pieces.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    return pieces + [rest] if rest else pieces


def _ticks(text: str) -> int:
    """``estimated_seconds`` of ``text`` in ticks, every character counted (spaces too)."""
    return _LATIN_TICKS * len(text) + (_CJK_TICKS - _LATIN_TICKS) * len(CJK_RE.findall(text))


def _spoken_ticks(text: str) -> int:
    """``estimated_seconds`` of ``text`` in ticks, each run of whitespace between words
    counted as one space and none at its ends: the same however its whitespace came (the
    reader's output may hold a space more or less where deltas were cut). Never more than
    ``_ticks(text)``, never less than ``estimated_seconds(tidy(text))``."""
    return _ticks(" ".join(text.split()))


def run_on_cut(text: str, max_seconds: float = MAX_SEGMENT_SECONDS) -> int:
    """Where text over ``max_seconds`` of speech that holds no sentence end is cut (run-on
    text, whole or streamed, and a long sentence in ``split_long``): within the longest
    start of it that fits (whitespace counted as by ``_spoken_ticks``), after its last
    clause or sentence mark (``,;:.!?`` and a spaced dash before a space; an em dash; CJK
    ``，；：、。！？``; no "." of a title such as "Dr."), else at its last space or CJK
    character, whichever is later, else (one long word) at a character.

    Returns ``cut``: ``text[:cut]`` is the segment (never only whitespace) and ``text[cut:]``
    the rest; ``len(text)`` when all of it fits.
    """
    ticks, spaced, first, fits = 0, False, -1, len(text)
    for index, char in enumerate(text):
        if char.isspace():
            spaced = first >= 0
            continue
        ticks += (_CJK_TICKS if CJK_RE.match(char) else _LATIN_TICKS) + (_LATIN_TICKS if spaced else 0)
        spaced, first = False, index if first < 0 else first
        if ticks > max_seconds * _TICKS_PER_SECOND:
            fits = index  # text[:fits] fits; text[fits] is the first character that does not
            break
    if fits == len(text):
        return fits
    clause = 0
    for mark in _RUN_ON_CLAUSE_RE.finditer(text, first + 1, fits):
        title = _LAST_WORD_DOT_RE.search(text, max(0, mark.start() - 8), mark.start() + 1)
        if not (title and title.group(1).lower() in _ABBREVIATIONS):
            clause = mark.end()
    if clause:
        return clause
    word = fits
    while word > first + 1 and not _word_boundary(text, word):
        word -= 1
    return word if _word_boundary(text, word) else fits


def _word_boundary(text: str, index: int) -> bool:
    """Whether a word ends before ``text[index]``: a space on either side, or a CJK
    character (each is a word)."""
    return any(char.isspace() or CJK_RE.match(char) for char in text[index - 1 : index + 1])


class Segmenter:
    """Turn text deltas into speakable segments, as soon as each is complete.

    Deltas may split anywhere. ``add`` returns the segments completed by a delta;
    ``finish`` returns the rest. Each segment is clean speech text (``MarkdownReader``) of
    at most ``MAX_SEGMENT_SECONDS`` estimated speech, with at least one letter or digit.
    Text with no sentence end is not held back past a segment's worth (``run_on_cut``).

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
        # Run-on text: an upper bound of the ticks of what the detector holds, counted up to
        # _bounded in _text, and the next check point where no decision point comes sooner.
        self._bound = 0
        self._bounded = 0
        self._next_check = RUN_ON_CHECK_CHARS
        # The first clause: the words and brackets of _text before _counted (running counts).
        self._counted = 0
        self._half_words = 0  # (a Chinese or Japanese character is half a word)
        self._brackets = [0, 0]  # "(" and ")"

    def add(self, delta: str) -> list[str]:
        """Feed one delta; return the segments it completed (possibly none)."""
        return self._push(self._reader.feed(delta), final=False)

    def finish(self) -> list[str]:
        """End the stream; return the segments of the text still buffered."""
        segments = self._push(self._reader.close(), final=True)
        self._release_run_on(segments)
        return segments + self._segments([self._detector.finish()])

    def _push(self, speech: str, final: bool) -> list[str]:
        """Mark certain boundaries in new speech text and feed the decided part to sentence-stream.

        Work per call is bounded by the new text (amortised): the loop visits each decision
        point once, the detector holds at most a segment of run-on text (``_check``), and
        ``_text`` keeps 64 characters of context before what the detector has not had.
        """
        text = self._text = self._text + speech.translate(_HIDE_ASTERISKS)
        pieces: list[str] = []
        out: list[str] = []
        start = pos = self._fed
        while match := _DECISION_RE.search(text, pos):
            begin, end = match.span()
            start = self._checks(text, start, begin, pieces, out)
            pos = end
            if not match.group().isspace():  # CJK punctuation or an em dash: decide right after it
                if (clause := self._clause_ends(end, final)) is None:
                    pieces.append(text[start:begin])  # what follows the mark decides: hold it
                    start = begin
                    break
                if clause:
                    pieces.append(text[start:end] + "\n\n")
                    start = self._marked(end)
                else:
                    if match.group() in "。！？":
                        self._first_clause = False
                    start = self._check(text, start, end, pieces, out)
                self._next_check = end + RUN_ON_CHECK_CHARS
                continue
            if "\n\n" in match.group():  # the reader's sentence mark
                self._first_clause = False
                self._marked(end)
                continue
            if (clause := self._clause_ends(begin, final, after=end)) is None:
                pieces.append(text[start:begin])  # what follows the space decides: hold it
                start = begin
                break
            if clause:
                pieces.append(text[start:begin] + "\n\n")
                start = self._marked(end)
                continue
            following = _NEXT_WORD_RE.match(text, end)
            if following is None and not final and _only_openers(text[end:]):
                pieces.append(text[start:begin])  # the next word decides: hold the space
                start = begin
                break
            before = text[max(0, begin - 40) : begin]
            if _missed_boundary(before, following):
                pieces.append(text[start:begin] + "\n\n")
                start = self._marked(end)
            else:
                if _SENTENCE_END_RE.search(before):
                    self._first_clause = False
                start = self._check(text, start, begin, pieces, out)
                self._next_check = end + RUN_ON_CHECK_CHARS
        else:
            start = self._checks(text, start, len(text), pieces, out)
            pieces.append(text[start:])
            start = len(text)
        self._fed = start
        out += self._segments(self._detector.add_chunk("".join(pieces)))
        if start > 64:  # keep a little context for the rules
            self._advance(text, start)
            shift = start - 64
            self._text, self._fed = text[shift:], 64
            self._bounded -= shift
            self._next_check -= shift
            self._counted -= shift
        return out

    def _marked(self, end: int) -> int:
        """A sentence mark was put before ``end``: the detector will hold nothing before it."""
        self._bound, self._bounded, self._next_check = 0, end, end + RUN_ON_CHECK_CHARS
        return end

    def _checks(self, text: str, start: int, stop: int, pieces: list[str], out: list[str]) -> int:
        """Check for run-on text every ``RUN_ON_CHECK_CHARS`` before ``stop`` (the next
        decision point, or the end of the text so far) since the last decision point."""
        while self._next_check < stop:
            start = self._check(text, start, self._next_check, pieces, out)
            self._next_check += RUN_ON_CHECK_CHARS
        return start

    def _check(self, text: str, start: int, point: int, pieces: list[str], out: list[str]) -> int:
        """At a check point (a decision point that marked no boundary, or every
        ``RUN_ON_CHECK_CHARS`` between them), when what the detector would hold up to
        ``point`` may be over a segment: feed it up to there and release run-on text.

        Check points depend on the text alone, and the detector's state after a text on the
        text alone (not on how it was cut), so whole and streamed text are cut alike.
        Returns the new start of what is not fed yet.
        """
        self._advance(text, point)
        if self._bound <= _MAX_SEGMENT_TICKS:
            return start
        pieces.append(text[start:point])
        out += self._segments(self._detector.add_chunk("".join(pieces)))
        pieces.clear()
        self._release_run_on(out)
        return point

    def _advance(self, text: str, point: int) -> None:
        """Count the speech text up to ``point`` into the bound of what the detector holds."""
        if point > self._bounded:
            self._bound += _ticks(text[self._bounded : point])
            self._bounded = point
        if not self._first_clause:
            self._counted = max(self._counted, point)  # (no longer needed)
        elif point > self._counted:
            counted = text[self._counted : point]  # (the text before is context for word starts)
            self._half_words += 2 * len(_WORD_START_RE.findall(text, self._counted, point))
            self._half_words += len(HAN_KANA_RE.findall(counted))
            self._brackets[0] += counted.count("(")
            self._brackets[1] += counted.count(")")
            self._counted = point

    def _release_run_on(self, out: list[str]) -> None:
        """While what the detector holds is over a segment's worth of speech, with no
        sentence end it can find, release its start as a segment (``run_on_cut``): a long
        reply without sentence punctuation is spoken as it streams, and the detector's
        buffer (which it searches at every delta) stays short."""
        while True:
            held = self._detector.current_sentence + self._detector.remaining_text
            self._bound = _ticks(held)
            if self._bound <= _MAX_SEGMENT_TICKS or _spoken_ticks(held) <= _MAX_SEGMENT_TICKS:
                return
            cut = run_on_cut(held)
            self._detector = SentenceBoundaryDetector()  # the same text, a sentence mark at the cut
            out += self._segments(self._detector.add_chunk(f"{held[:cut]}\n\n{held[cut:]}"))

    def _clause_ends(self, end: int, final: bool, after: int | None = None) -> bool | None:
        """True (once) when the first segment of streamed text may end at ``end``: a clause
        mark there, enough words before it, no sentence end and no open bracket before it,
        and speech after it, from ``after`` (``end`` if None; ``_SPEECH_FOLLOWS_RE``): None
        while what has come after it is no speech yet and more may come."""
        if not self._first_clause:
            return False
        if not _CLAUSE_END_RE.search(self._text, max(0, end - 3), end):
            return False
        self._advance(self._text, end)
        if self._brackets[0] > self._brackets[1] or self._half_words < 2 * FIRST_CLAUSE_MIN_WORDS:
            return False
        if not _SPEECH_FOLLOWS_RE.match(self._text, end if after is None else after):
            return False if final else None
        self._first_clause = False
        return True

    def _segments(self, sentences: Iterable[str]) -> list[str]:
        """Speakable segments of sentence-stream's sentences: tidied, with their asterisks
        back and products spoken (``_spoken_operators``), cut to ``MAX_SEGMENT_SECONDS``."""
        out: list[str] = []
        for sentence in sentences:
            text = _spoken_operators(tidy(sentence.translate(_SHOW_ASTERISKS)))
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
