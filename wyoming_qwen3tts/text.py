"""The text front end: an LLM's markdown reply in, speakable segments out.

Text arrives whole (``synthesize``, HTTP ``input``) or as deltas split anywhere, even inside
``**``, a number or a URL (Wyoming ``synthesize-chunk``). Two streaming stages make it
speakable; neither ever emits half a markup token:

1. ``MarkdownReader`` turns markdown into speech text. List items, headings and table rows
   end as sentences (a missing final period is added); bold, italic and strikethrough
   markers vanish; fenced code blocks are skipped and inline code is read only when it is
   short (a name or a value); tables are read row by row, cells joined by commas; links are
   read as their text and bare URLs as their domain; emoji and pictographs are dropped.
   Symbols that carry meaning (°, %, currency signs, @, &) and all numbers, dates and times
   are left to the model, which reads them in context. HTML and SSML markup (LLM replies
   carry ``<br>`` in tables, ``<sup>``, ``<details>`` and entities; Home Assistant users send
   SSML out of habit) is read as a browser shows it: tags are not spoken, the text inside
   them is; block tags, ``<br>`` and SSML ``<break>`` end a phrase; entities are decoded;
   ``<script>``, ``<style>``, ``<think>`` and comments are not spoken. Angle brackets that
   open no known tag ("a < b", "x<5", "<3", "Vec<T>") are prose and stay.
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
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

from sentence_stream import SentenceBoundaryDetector

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

#: Longest inline code read aloud, in characters: a name or a value (`aria`, `22.5`);
#: longer spans (commands, expressions) are skipped.
MAX_SPOKEN_CODE_CHARS = 24

#: Longest text held back while a link, inline code or URL may still close, in characters
#: (bounds the work per delta; longer ones are read as plain text).
_MAX_HELD_CHARS = 300

#: Capitalised words of up to three letters that end with "." inside a sentence: titles
#: and company suffixes of the model's languages (sentence-stream treats every such short
#: word as a possible abbreviation; the others, "Yes.", "Bob.", "TTS.", end sentences).
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st sr jr mt ft lt co col gen rev sen rep gov sgt inc ltd vs nr hr fr frl "
    "mme sra dra srs ud uds sig av prof str vol".split()
)

_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
#: Scripts whose sentences end with "。" (Chinese and Japanese; Korean uses ".").
_HAN_KANA_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_WORD_RE = re.compile(r"[^\W\d_]+")
_SPEAKABLE_RE = re.compile(r"\w")
#: Emoji, pictographs, arrows and their joiners, variation selectors, keycaps and tags (not
#: other symbols: "°", "©", "€" and "%" are spoken).
_EMOJI_RE = re.compile(
    "[\U0001F000-\U0001FAFF\u2190-\u21FF\u2300-\u23FF\u2600-\u27BF\u2B00-\u2BFF"
    "\uFE0E\uFE0F\u200D\u20E3\U000E0020-\U000E007F]"
)
_SPACE_RE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+([.,!?;:…。！？，、：；])(?=\s|$)")
_CLAUSE_BREAK_RE = re.compile(r"(?<=[,;:，；：、])\s*")
_CLOSERS = "\"')]}»”’」』）》】"
_TERMINAL = set(".!?…:;。！？：；")

# --- markdown lines --------------------------------------------------------------------------
_FENCE_RE = re.compile(r"(`{3,}|~{3,})")
_RULE_RE = re.compile(r"([-*_=])(?:[ \t]*\1){2,}[ \t]*")  # also a setext heading's underline
_HEADING_RE = re.compile(r"#{1,6}(?:\s+|$)(?:\d{1,3}[.)]\s+)?")
_ITEM_RE = re.compile(r"(?:[-*+•]|\d{1,3}[.)])\s+|・\s*")
_QUOTE_RE = re.compile(r"(?:>\s?)+")
#: Line starts that may still become a marker above once more characters arrive.
_UNDECIDED_RE = re.compile(r"`{1,2}|~{1,2}|#{1,6}(?:\s+\d{0,3}[.)]?)?|[-*_+=][-*_+= \t]*|\d{1,3}[.)]?|>[>\s]*")
_SEPARATOR_CELL_RE = re.compile(r"\s*:?-+:?\s*")
_STRUCTURAL = ("heading", "item", "table")

# --- HTML and SSML markup --------------------------------------------------------------------
#: Marks in the reader's inline speech text (private-use characters, removed from the input):
#: a phrase ends; an item, heading or table row ends as a sentence; a table cell ends.
_BREAK, _ITEM_END, _CELL = "\ue000", "\ue001", "\ue002"
_MARKS_RE = re.compile(f"([{_BREAK}{_ITEM_END}{_CELL}])")
_NO_MARKS = str.maketrans("", "", _BREAK + _ITEM_END + _CELL)
#: Tags that end a phrase (a pause, no period added): blocks, ``<br>``, SSML ``<break>``,
#: ``<p>`` and ``<s>`` (HTML's strikethrough ``<s>`` too: its words are still spoken).
_BREAK_TAGS = frozenset(
    "address article aside blockquote body br break center details dialog div dl fieldset figcaption "
    "figure footer form header hgroup hr html legend main menu nav ol p pre s search section table "
    "tbody tfoot thead ul".split()
)
#: Tags that end their text as a sentence, like a markdown list item, heading or table row.
_ITEM_TAGS = frozenset("caption dd dt h1 h2 h3 h4 h5 h6 li summary tr".split())
#: Items whose start also ends the item before, which HTML lets stay open ("<li>a<li>b").
_OPEN_ITEM_TAGS = frozenset("dd dt li tr".split())
_CELL_TAGS = frozenset(("td", "th"))
#: Containers whose end also ends an item left open ("<li>two</ul>": "two.").
_LIST_TAGS = frozenset("dl ol table tbody tfoot thead ul".split())
#: Elements whose content is not spoken (as a browser shows none of it; ``<think>`` holds a
#: reasoning model's thoughts), up to their closing tag or the end of the text.
_HIDDEN_TAGS = ("script", "style", "think")
#: Every other tag known: dropped, its text spoken (SSML wrappers, inline HTML). Tags are
#: lowercase, as LLMs and SSML write them: "press <A>" and "Vec<T>" stay prose.
_INLINE_TAGS = frozenset(
    "a abbr audio b bdi bdo big button cite code data del desc dfn em emphasis font head i iframe "
    "img input ins kbd label lang lexicon link mark media meta metadata meter nobr noscript object "
    "option output par phoneme picture progress prosody q rp rt ruby samp say-as select seq small "
    "source span speak strike strong sub sup svg template textarea time title token track tt u var "
    "video voice w wbr".split()
)
_TAG_NAMES = _BREAK_TAGS | _ITEM_TAGS | _CELL_TAGS | _INLINE_TAGS | set(_HIDDEN_TAGS)
_NAME = (
    r"(?:[a-z][a-z0-9]*:[a-z][\w.-]*"  # namespaced: amazon:effect, mstts:express-as
    rf"|(?:{'|'.join(sorted(_TAG_NAMES, key=len, reverse=True))})(?![\w:-]))"
)
#: HTML attributes that may stand without a value; other attributes need one, so that
#: "if a<b and c>d" is no ``<b>`` tag.
_BOOLEAN_ATTRIBUTES = "|".join(
    "allowfullscreen async autofocus autoplay checked controls default defer disabled hidden inert "
    "loop multiple muted nowrap open readonly required reversed selected".split()
)
_VALUE = r"""(?:"[^"<>]*"|'[^'<>]*'|[^\s"'=<>`]+)"""
_ATTRIBUTES = rf"(?:\s+(?:[A-Za-z_:][\w:.-]*\s*=\s*{_VALUE}|(?:{_BOOLEAN_ATTRIBUTES})(?![\w:.-])))*"
_MARKUP = (
    r"(?P<comment><!--(?P<comment_end>.*?-->)?)"  # an open one hides the lines up to "-->"
    rf"|(?P<hidden><(?P<hidden_name>{'|'.join(_HIDDEN_TAGS)}|sub(?=[^<>]*\salias\s*=))(?![\w:-])"
    rf"(?P<hidden_attrs>{_ATTRIBUTES})\s*>(?P<hidden_end>.*?</(?P=hidden_name)\s*>)?)"
    rf"|(?P<tag></?(?P<tag_name>{_NAME})(?P<attrs>{_ATTRIBUTES})\s*/?>|<![A-Za-z][^<>]*>|<\?[^<>]*\?>)"
    r"|(?P<mail><(?P<address>[\w.+-]+@[\w-]+(?:\.[\w-]+)+)>)"
    r"|(?P<entity>&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});)"
)
#: Text from a "<" or "&" that may still become markup once more characters arrive.
_PARTIAL_MARKUP_RE = re.compile(
    r"&(?:#[xX]?[0-9a-fA-F]{0,7}|[A-Za-z][A-Za-z0-9]{0,31})?"
    r"|<(?:!(?:-|[A-Za-z][^<>]*)?|\?[^<>]*|[\w.+-]*(?:@[\w.-]*)?)"
    r"|</?(?:(?P<name>[a-z][\w:-]*)"
    r"""(?P<attrs>(?:\s+[A-Za-z_:][\w:.-]*(?:\s*=\s*(?:"[^"<>]*"?|'[^'<>]*'?|[^\s"'=<>`]*))?)*\s*/?))?"""
)
_ATTRIBUTE_RE = re.compile(rf"""([A-Za-z_:][\w:.-]*)\s*=\s*("[^"<>]*"|'[^'<>]*'|[^\s"'=<>`]+)""")
#: A ``<break>`` that is no pause: no strength, or no time.
_SILENT_BREAK_RE = re.compile(
    r"""\bstrength\s*=\s*["']?(?:none|x-weak)\b|\btime\s*=\s*["']?0*(?:\.0*)?m?s\b"""
)
#: Decoded entities that are spaces or no text (no-break space, soft hyphen, zero-width
#: characters), and the reader's marks.
_ENTITY_TEXT = str.maketrans(
    dict.fromkeys("\xa0\t\n\r", " ")
    | dict.fromkeys("\xad\u200b\u200c\u200d\u2060\ufeff" + _BREAK + _ITEM_END + _CELL)
)

# --- inline markdown -------------------------------------------------------------------------
_INLINE_RE = re.compile(
    r"(?P<code>(?<!`)(?P<ticks>`+)(?!`)(?P<code_text>.+?)(?<!`)(?P=ticks)(?!`))"  # equal runs
    r"|(?P<link>!?\[(?P<label>[^\[\]\n]*)\]\(\s*<?[^)\s>]*>?(?:\s+[\"'(][^\n)]*[\"')])?\s*\))"
    rf"|(?P<url><?(?<![A-Za-z0-9/@.])(?:https?://|www\.)[^\s<>\[\]{_CJK}]+>?)"  # see _URL_GLUE_RE
    rf"|{_MARKUP}"
    r"|(?P<marker>\*+|~~+|_+)"
)
#: A tail that may still become a link: "[text", "[text]", "[text](http...".
_PARTIAL_LINK_RE = re.compile(r"!?\[[^\[\]\n]*(?:\](?:\([^)\n]*)?)?")
_URL_TRAIL = ".,;:!?'\")]}>"
#: Characters after which "http..." or "www." does not start a URL (the lookbehind above).
_URL_GLUE_RE = re.compile(r"[A-Za-z0-9/@.]")
#: A word that is, or may still grow into, a bare URL.
_URL_START_RE = re.compile(r"[<(\"']*(?:https?://|www\.|h(?:t(?:t(?:p(?:s?:?/?)?)?)?)?$|w(?:ww?)?$)", re.I)

# --- sentence boundaries ---------------------------------------------------------------------
#: Where the segmenter decides about a boundary: whitespace runs, and marks after which CJK
#: text (no spaces) or an unspaced em dash may end a clause or sentence.
_DECISION_RE = re.compile(r"\s+|[，；：、。！？—]")
_CLAUSE_END_RE = re.compile(r"(?:[,;:，；：、—]|\s[-–])$")
_SENTENCE_END_RE = re.compile(rf"[.!?…。！？](?:\s?[{re.escape(_CLOSERS)}])*$")
#: A sentence end before a closing quote with a space before it (French "Bonjour. »").
_SPACED_CLOSE_RE = re.compile(rf"[.!?…]\s[{re.escape(_CLOSERS)}]+$")
_OPENERS = "¿¡\"“„«‘'("
_NEXT_WORD_RE = re.compile(rf"([{re.escape(_OPENERS)}]*)(\w)")
_LAST_WORD_DOT_RE = re.compile(r"(?<![\w.])([^\W\d_]+)\.$")


def clean_text(text: str) -> str:
    """Make a whole text speakable (``MarkdownReader``), with whitespace collapsed.

    Returns "" when nothing speakable is left (e.g. for "🎉" or a lone code block).
    """
    reader = MarkdownReader()
    speech = _tidy(reader.feed(text) + reader.close())
    return speech if _SPEAKABLE_RE.search(speech) else ""


def estimated_seconds(text: str) -> float:
    """Rough upper estimate of the speech duration of ``text``, in seconds."""
    cjk = len(_CJK_RE.findall(text))
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


def _tidy(text: str) -> str:
    """Collapse whitespace (sentence marks included) and drop spaces before punctuation."""
    return _SPACE_BEFORE_PUNCT_RE.sub(r"\1", _SPACE_RE.sub(" ", text).strip())


class MarkdownReader:
    """Streaming markdown -> speech text, for the ``Segmenter``.

    ``feed`` takes raw deltas split anywhere and returns the speech text that is final so
    far; ``close`` returns the rest. Undecided text (a line start that may be a list
    marker, a word that may be a URL or end in ``**``, a link or code span not closed yet)
    is held back until it is decided, so the output never holds half a markup token. The
    output uses single spaces; ``"\\n\\n"`` marks a sentence end the markdown made certain
    (sentence-stream splits at blank lines).
    """

    def __init__(self) -> None:
        self._buf = ""  # raw text of the current line not consumed yet
        self._kind: str | None = None  # the current line's kind, once its start is decided
        self._fence: str | None = None  # the closing fence while inside a code block
        self._tail = ""  # last characters emitted since the last sentence mark
        self._left = " "  # the last raw character consumed on the current line
        self._hidden: re.Pattern[str] | None = None  # the end of a hidden element or comment
        self._comma = False  # a table cell ended: a comma before the next words

    def feed(self, delta: str) -> str:
        """Add a delta; return the speech text it completed (possibly "")."""
        self._buf += delta.translate(_NO_MARKS)
        out: list[str] = []
        while (newline := self._buf.find("\n")) >= 0:
            line, self._buf = self._buf[:newline].rstrip("\r"), self._buf[newline + 1 :]
            out.append(self._line(line, complete=True)[0])
        text, used = self._line(self._buf, complete=False)
        self._buf = self._buf[used:]
        out.append(text)
        return "".join(out)

    def close(self) -> str:
        """End of text: return the rest, the last block ended as a sentence."""
        out = self._line(self._buf, complete=True)[0] if self._buf or self._kind else ""
        self._buf, self._fence, self._hidden = "", None, None
        return out + self._end_block(period=False)

    def _line(self, text: str, complete: bool) -> tuple[str, int]:
        """Speech text of (part of) the current line and how many of its characters it used."""
        if self._kind == "skip":  # the rest of a fence line
            if complete:
                self._kind = None
            return "", len(text)
        if self._fence is not None:  # a line inside a code block: skipped once complete
            if not complete:
                return "", 0
            if _closes_fence(text, self._fence):
                self._fence = None
            return "", len(text)
        out, start = "", 0
        if self._kind is None and self._hidden is not None:
            self._kind = "plain"  # a line inside a comment or hidden element has no markdown
        if self._kind is None:
            decided = _line_kind(text, complete)
            if decided is None:
                return "", 0
            self._kind, start = decided
            if self._kind not in ("plain", "quote"):
                out = self._end_block(period=False)
            if self._kind == "fence":
                self._fence, self._kind = text.strip()[:3], "skip"
                return out + self._line(text[start:], complete)[0], len(text)
        if self._kind in ("blank", "rule"):
            self._kind = None
            return out, len(text)
        if self._kind == "table":
            if not complete:
                return out, 0
            out += self._emit(_table_row(text[start:]))
            used = len(text)
        else:
            speech, used = self._inline_text(text[start:], complete)
            out += self._emit(speech)
            used += start
        if complete:
            out += self._line_end()
        return out, used

    def _inline_text(self, text: str, complete: bool) -> tuple[str, int]:
        """Speech text of the decided prefix of (the rest of) a line and its length; what is
        inside a comment, ``<script>``, ``<style>`` or ``<think>`` is dropped, even across
        lines, up to its end (held back while the end may be arriving)."""
        out, pos = "", 0
        while True:
            if self._hidden is not None:
                end = self._hidden.search(text, pos)
                if end is None:
                    pos = len(text) if complete else _hidden_upto(text, pos)
                    return out, pos
                pos, self._hidden, self._left = end.end(), None, text[end.end() - 1]
            speech, used, self._hidden = _inline_prefix(text[pos:], complete, self._left)
            out += speech
            self._left = text[pos + used - 1] if used else self._left
            pos += used
            if self._hidden is None:
                return out, pos

    def _line_end(self) -> str:
        """At a newline: structural lines end as sentences; a plain line that ends with
        sentence or clause punctuation does too; other line breaks are spaces."""
        kind, self._kind, self._left = self._kind, None, " "
        if kind in _STRUCTURAL:
            return self._end_block(period=True)
        core = self._tail.rstrip(_CLOSERS)
        return self._end_block(period=False) if core and core[-1] in _TERMINAL else " "

    def _emit(self, text: str) -> str:
        """Speech text out, its marks from markup (``_BREAK``, ``_ITEM_END``, ``_CELL``) made
        sentence marks and commas."""
        out: list[str] = []
        for index, part in enumerate(_MARKS_RE.split(text)):
            if index % 2:  # a mark
                if part == _CELL:
                    self._comma = bool(self._tail) and self._tail[-1] not in _TERMINAL | {","}
                else:
                    out.append(self._end_block(period=part == _ITEM_END))
            elif part:
                if self._comma and not part.isspace():
                    part, self._comma = ", " + part, False
                self._tail = (self._tail + "".join(part.split()))[-8:]  # however the text was split
                out.append(part)
        return "".join(out)

    def _end_block(self, period: bool) -> str:
        """A sentence mark after what was emitted since the last one, if anything was; with
        ``period``, a final "." (or "。" after Chinese or Japanese) unless punctuated."""
        self._comma = False
        if not self._tail:
            return ""
        core, end = self._tail.rstrip(_CLOSERS), ""
        if period and (not core or core[-1] not in _TERMINAL):
            end = "。" if core and _HAN_KANA_RE.match(core[-1]) else "."
        self._tail = ""
        return end + "\n\n"


def _line_kind(text: str, complete: bool) -> tuple[str, int] | None:
    """The kind of a line from its start, and where its content begins; None while the
    start is still undecided (a partial line that may yet become a marker)."""
    body = text.lstrip()
    indent = len(text) - len(body)
    if not body:
        return ("blank", len(text)) if complete else None
    if not complete and _UNDECIDED_RE.fullmatch(body):
        return None
    if _FENCE_RE.match(body):
        return "fence", indent
    if _RULE_RE.fullmatch(body):
        return "rule", len(text)
    for kind, pattern in (("heading", _HEADING_RE), ("item", _ITEM_RE), ("quote", _QUOTE_RE)):
        if match := pattern.match(body):
            return kind, indent + match.end()
    if body.startswith("|"):
        return "table", indent
    return "plain", indent


def _closes_fence(line: str, fence: str) -> bool:
    body = line.strip()
    return body.startswith(fence) and not body.strip(fence[0])


def _table_row(line: str) -> str:
    """A table row read as its cells joined by commas; "" for the header separator row."""
    cells = [c for c in line.strip().strip("|").split("|")]
    if all(_SEPARATOR_CELL_RE.fullmatch(c) for c in cells):
        return ""
    # A mark inside a cell (``<br>``) is read as a comma, like the cells' borders.
    parts = (_tidy(p) for c in cells for p in _MARKS_RE.split(_inline(c))[::2])
    return ", ".join(p for p in parts if p)


def _inline_prefix(text: str, complete: bool, left: str) -> tuple[str, int, re.Pattern[str] | None]:
    """Speech text of the longest decided prefix of (the rest of) a line, its length, and
    the end to look for when it ends with the start of a comment or hidden element.

    ``left`` is the raw character before ``text`` on its line (" " at the line start).
    Undecided, and held back: a link or code span not closed yet, a last word that is or
    may become a URL, markup characters at the end (``**`` may continue), and a ``<`` or
    ``&`` that may still become a tag or an entity.
    """
    if complete:
        for token in _INLINE_RE.finditer(left + text, 1):  # (as _inline reads it)
            if hidden := _hides(token):
                return _inline(text[: token.end() - 1], left), token.end() - 1, hidden
        return _inline(text, left), len(text), None
    cut = word = floor = i = 0  # floor: the end of the last entity, never cut inside
    while i < len(text):
        if i and _splits(text[i - 1]):
            cut = word = i
        elif i and text[i - 1].isalnum():
            cut = i
        if text[i] in "<&":
            match = _INLINE_RE.match(text, i)
            if match and match["url"] is None:  # a tag, comment, mail address or entity
                if hidden := _hides(match):
                    return _inline(text[: match.end()], left), match.end(), hidden
                i = cut = floor = match.end()  # (an entity may be part of a URL: the word goes on)
                word = word if match["entity"] else i
                continue
            if not match and len(text) - i < _MAX_HELD_CHARS and _may_become_markup(text[i:]):
                break
        elif text[i] == "`" or text.startswith("[", i) or text.startswith("![", i):
            match = _INLINE_RE.match(text, i)
            closed = match and (match["link"] is not None or (match["code"] and match.end() < len(text)))
            if match and closed:  # (a closing backtick at the end may be part of a longer run)
                i = cut = word = match.end()
                continue
            open_construct = text[i] == "`" or _PARTIAL_LINK_RE.fullmatch(text, i)
            if open_construct and len(text) - i < _MAX_HELD_CHARS:
                break
        i += 1
    else:
        if text and (_splits(text[-1]) or text[-1].isalnum()):
            cut = len(text)
    for start in range(word, cut):  # hold a URL, or what may become one, from its start
        glued = _URL_GLUE_RE.match(text[start - 1] if start else left)
        if not glued and _URL_START_RE.match(text, start) and len(text) - start < _MAX_HELD_CHARS:
            cut = start
            while cut > max(word, floor) and not (text[cut - 1].isalnum() or _splits(text[cut - 1])):
                cut -= 1  # markup before it is decided with what follows
            break
    return _inline(text[:cut], left), cut, None


def _hides(match: re.Match[str]) -> re.Pattern[str] | None:
    """The end to look for when ``match`` opens a comment or hidden element that does not
    end in the same text; else None."""
    if match["comment"] is not None and match["comment_end"] is None:
        return re.compile("-->")
    if match["hidden"] is not None and match["hidden_end"] is None:
        return re.compile(rf"</{match['hidden_name']}\s*>")
    return None


def _hidden_upto(text: str, start: int) -> int:
    """How much of ``text`` inside a comment or hidden element may be dropped while its end
    has not come: all but what may still begin it (a last ``<``, trailing dashes)."""
    keep = len(text) - min(2, len(text) - len(text.rstrip("-")))
    bracket = text.rfind("<", start)
    if bracket >= 0 and ">" not in text[bracket:] and len(text) - bracket < _MAX_HELD_CHARS:
        keep = min(keep, bracket)
    return max(start, keep)


def _may_become_markup(text: str) -> bool:
    """Whether ``text``, from a ``<`` or ``&`` to the end of what has come, may still become
    a tag, comment, declaration, mail address or entity."""
    match = _PARTIAL_MARKUP_RE.fullmatch(text)
    if match is None:
        return False
    name = match["name"]
    if name is None or not match["attrs"]:
        return True  # the name may still grow (into a namespaced one too)
    return name in _TAG_NAMES or ":" in name


def _splits(char: str) -> bool:
    """Whether a word ends after ``char``: whitespace, or a CJK character or mark."""
    return char.isspace() or bool(_CJK_RE.match(char)) or char in "。！？，、：；"


def _inline(text: str, left: str = " ") -> str:
    """Inline markdown of decided text -> speech text (see the module docstring); ``left``
    is the raw character before ``text``, which the patterns' lookbehinds see as they
    would in the whole line ("2" + "http://": no URL, as in "2http://")."""
    line, last = left + text, 1
    out: list[str] = []
    for match in _INLINE_RE.finditer(line, 1):
        out += (line[last : match.start()], _inline_sub(match))
        last = match.end()
    out.append(line[last:])
    return _EMOJI_RE.sub(" ", "".join(out))


def _inline_sub(match: re.Match[str]) -> str:
    """What one token of ``_INLINE_RE`` is read as; ``match.string`` starts with the raw
    character before the text."""
    if match["code"]:
        code = match["code_text"].strip()
        return code if len(code) <= MAX_SPOKEN_CODE_CHARS else " "
    if match["link"] is not None:
        return _inline(match["label"])
    if match["url"]:
        return _domain(match["url"])
    if match["comment"] is not None:
        return ""
    if match["hidden"] is not None:  # (its content is dropped by the reader, or here)
        return _attribute(match["hidden_attrs"], "alias") if match["hidden_name"] == "sub" else ""
    if match["tag"] is not None:
        return _tag(match["tag_name"], match["attrs"] or "", closing=match["tag"].startswith("</"))
    if match["mail"] is not None:
        return match["address"]
    if match["entity"] is not None:
        decoded = html.unescape(match["entity"])
        return decoded.translate(_ENTITY_TEXT) if decoded != match["entity"] else decoded
    marker, text = match["marker"], match.string
    before = text[match.start() - 1]
    after = text[match.end()] if match.end() < len(text) else " "
    if marker[0] == "_" and before.isalnum() and after.isalnum():
        return marker  # snake_case and a_b@c.de keep their underscores
    if marker == "*" and before.isspace() and after.isspace():
        return marker  # "5 * 3": no emphasis can open and close at spaces on both sides
    return ""


def _tag(name: str | None, attributes: str, closing: bool) -> str:
    """What a tag is read as: a mark for a block, item or cell, an image's alt text, else
    nothing (inline HTML, SSML wrappers, declarations). A ``<break>`` of no strength or no
    time is no break."""
    if name in _CELL_TAGS:
        return _CELL
    if name in (_ITEM_TAGS | _LIST_TAGS if closing else _OPEN_ITEM_TAGS):
        return _ITEM_END
    if name == "break" and _SILENT_BREAK_RE.search(attributes):
        return ""
    if name in _BREAK_TAGS or name in _ITEM_TAGS:  # (a heading's start: like a block's)
        return _BREAK
    return f" {_attribute(attributes, 'alt')} " if name == "img" else ""


def _attribute(attributes: str, name: str) -> str:
    """The speech text of an attribute's value ("" when absent)."""
    for match in _ATTRIBUTE_RE.finditer(attributes):
        if match[1].lower() == name:
            value = match[2][1:-1] if match[2][0] in "\"'" else match[2]
            return _MARKS_RE.sub(" ", _inline(value))
    return ""


def _domain(url: str) -> str:
    """A bare URL read as its domain ("https://www.example.com/a?b." -> "example.com.")."""
    core = url.lstrip("<")
    bare = core.rstrip(_URL_TRAIL)
    trail = core[len(bare) :].replace(">", "")
    try:
        host = urlsplit(bare if "://" in bare else f"http://{bare}").hostname or ""
    except ValueError:
        host = ""
    return host.removeprefix("www.") + trail


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
        words = len(_WORD_RE.findall(_HAN_KANA_RE.sub(" ", head))) + len(_HAN_KANA_RE.findall(head)) / 2
        if words < FIRST_CLAUSE_MIN_WORDS:
            return False
        self._first_clause = False
        return True

    def _segments(self, sentences: Iterable[str]) -> list[str]:
        out: list[str] = []
        for sentence in sentences:
            text = _tidy(sentence)
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
