"""Reading an LLM's markdown as it streams in: raw deltas in, speech text out.

``MarkdownReader`` takes deltas split anywhere, even inside ``**``, a number or a URL, and
returns the speech text that is final so far, never half a markup token. List items,
headings and table rows end as sentences (a missing final period is added); bold, italic
and strikethrough markers vanish; fenced code blocks are skipped and inline code is read
only when it is short (a name or a value); tables are read row by row, cells joined by
commas; links are read as their text and bare URLs as their domain; emoji and pictographs
are dropped, and so are terminal escape sequences (colour codes in a tool's output), whole,
even cut across deltas (``writing.drop_escapes``). Symbols that carry meaning (°, %,
currency signs, @, &, a "*" that is no emphasis: "5 * 3", "2*3", "Rated 5* by users") and all
numbers, dates and times are left to the model, which reads them in context.

A "*" run is emphasis as CommonMark's flanking rules and its pairing of runs say
(``_Emphasis.run``): it may open when a word follows it, close when a word precedes it; one
that can only close is emphasis only when a run it may pair with is open on its line
("Rated 5*", "5* by users" keep their star, as CommonMark keeps them), the stars of either
run that pairing leaves over are text ("**a*" is "*" + italic "a", "*a**" italic "a" + "*"),
and "A*B and a*b" is "A" + italic "B and a" + "b", as the spec reads it. One that opens is
emphasis only once a closer comes, on its line and within ``MAX_EMPHASIS_CHARS``; else it
is text, as CommonMark keeps it ("a *b", "**a", "Rating: *").
So the speech text after a run that opens waits for its closer, at most until its line ends
or ``MAX_EMPHASIS_CHARS`` have passed; the text before it is not held, nor is any text for
a "*" that cannot open (spaced, arithmetic, after a word). Emphasis does not go on over a
line break, as CommonMark's may within a paragraph.

A line's start is read first (``_line_kind``: fence, rule, heading, item, quote, table or
plain), then its inline tokens (``_INLINE_RE``: code, links, URLs, markup, emphasis
markers). A tag whose attributes go on over the next lines is joined into one line first
(``_lines``), and a tag cut off by the end of the text is dropped when it can only be markup
(``close``). HTML and SSML tags, entities, comments and hidden elements are tokens of that
inline stage: their grammar, tag names, marks and streamed holding come from ``markup.py``;
what a tag is read as (``_tag``, ``_attribute``) is decided here, as an ``<img>``'s alt text
and an SSML ``<sub>``'s alias are read as inline markdown themselves. Where sentences and
segments end is left to ``segmenter.py``'s ``Segmenter``, which gets this reader's output:
single spaces, with ``"\\n\\n"`` where the markdown made a sentence end certain.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from .markup import (
    ATTRIBUTE_RE,
    BREAK,
    BREAK_TAGS,
    CELL,
    CELL_TAGS,
    ENTITY_TEXT,
    HIDDEN_TAGS,
    HUSH,
    INPUT_TEXT,
    ITEM_END,
    ITEM_TAGS,
    LIST_TAGS,
    MARKS_RE,
    MARKUP,
    MAX_HELD_CHARS,
    OPEN_ITEM_TAGS,
    SILENT_BREAK_RE,
    hidden_upto,
    hides,
    may_become_markup,
    unfinished_tag,
)
from .writing import CJK, CJK_RE, CLOSERS, FINAL, HAN_KANA_RE, TERMINAL, drop_escapes, tidy

#: Longest inline code read aloud, in characters: a name or a value (`aria`, `22.5`);
#: longer spans (commands, expressions) are skipped.
MAX_SPOKEN_CODE_CHARS = 24

#: Emoji, pictographs, arrows and their joiners, variation selectors, keycaps and tags (not
#: other symbols: "°", "©", "€" and "%" are spoken).
_EMOJI_RE = re.compile(
    "[\U0001F000-\U0001FAFF\u2190-\u21FF\u2300-\u23FF\u2600-\u27BF\u2B00-\u2BFF"
    "\uFE0E\uFE0F\u200D\u20E3\U000E0020-\U000E007F]"
)

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
_BLANK_LINE_RE = re.compile(r"\n[ \t\r]*\n")
_NEWLINE_RE = re.compile(r"\r?\n")

# --- inline markdown -------------------------------------------------------------------------
_INLINE_RE = re.compile(
    r"(?P<code>(?<!`)(?P<ticks>`+)(?!`)(?P<code_text>.+?)(?<!`)(?P=ticks)(?!`))"  # equal runs
    r"|(?P<link>!?\[(?P<label>[^\[\]\n]*)\]\(\s*<?[^)\s>]*>?(?:\s+[\"'(][^\n)]*[\"')])?\s*\))"
    rf"|(?P<url><?(?<![A-Za-z0-9/@.])(?:https?://|www\.)[^\s<>\[\]{CJK}]+>?)"  # see _URL_GLUE_RE
    rf"|{MARKUP}"
    r"|(?P<marker>\*+|~~+|_+)"
)
#: A tail that may still become a link: "[text", "[text]", "[text](http...".
_PARTIAL_LINK_RE = re.compile(r"!?\[[^\[\]\n]*(?:\](?:\([^)\n]*)?)?")
_URL_TRAIL = ".,;:!?'\")]}>"
#: Characters after which "http..." or "www." does not start a URL (the lookbehind above).
_URL_GLUE_RE = re.compile(r"[A-Za-z0-9/@.]")
#: A word that is, or may still grow into, a bare URL.
_URL_START_RE = re.compile(r"[<(\"']*(?:https?://|www\.|h(?:t(?:t(?:p(?:s?:?/?)?)?)?)?$|w(?:ww?)?$)", re.I)


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
        self._escape = ""  # raw text of a terminal escape sequence that may still go on
        self._emphasis = _Emphasis()  # the "*" runs open on this line, and the text they hold

    def feed(self, delta: str) -> str:
        """Add a delta; return the speech text it completed (possibly "")."""
        text, self._escape = drop_escapes(self._escape + delta, final=False)
        self._buf += text.translate(INPUT_TEXT)
        out, waiting = self._lines(final=False)
        if not waiting:
            text, used = self._line(self._buf, complete=False)
            self._buf = self._buf[used:]
            out += text
        return out

    def close(self) -> str:
        """End of text: return the rest, the last block ended as a sentence. A tag begun at
        the very end that can only be markup (``markup.unfinished_tag``) is dropped, and so
        is a terminal escape sequence cut off by the end."""
        self._escape = ""
        self._buf = self._buf[: unfinished_tag(self._buf)]
        out = self._lines(final=True)[0]
        out += self._line(self._buf, complete=True)[0] if self._buf or self._kind else ""
        self._buf, self._fence, self._hidden = "", None, None
        return out + self._end_block(period=False)

    def _lines(self, final: bool) -> tuple[str, bool]:
        """Speech text of the complete lines buffered, and whether a line waits for a tag
        begun at its end that may go on over the next line (an attribute on the line after
        the tag's name): a tag that does is joined into one line, its line breaks spaces."""
        out: list[str] = []
        while (newline := self._buf.find("\n")) >= 0:
            start = self._buf.rfind("<", 0, newline)  # (a tag's values hold no "<")
            if self._fence is None and self._kind != "skip" and start >= 0:
                tag, rest = _INLINE_RE.match(self._buf, start), self._buf[start:]
                if tag and tag.end() > newline and not _BLANK_LINE_RE.search(tag[0]):
                    joined = _NEWLINE_RE.sub(" ", tag[0])
                    self._buf = self._buf[:start] + joined + self._buf[tag.end() :]
                    continue
                held = not (tag or final) and len(rest) < MAX_HELD_CHARS  # (bounds the work)
                if held and may_become_markup(rest) and not _BLANK_LINE_RE.search(rest):
                    text, used = self._line(self._buf[:newline], complete=False)
                    self._buf = self._buf[used:]
                    return "".join(out) + text, True
            line, self._buf = self._buf[:newline].rstrip("\r"), self._buf[newline + 1 :]
            out.append(self._line(line, complete=True)[0])
        return "".join(out), False

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
            if complete:  # (runs still open are text)
                speech += self._emphasis.end()
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
                    pos = len(text) if complete else hidden_upto(text, pos)
                    return out, pos
                pos, self._hidden, self._left = end.end(), None, text[end.end() - 1]
            speech, used, self._hidden = _inline_prefix(text[pos:], complete, self._left, self._emphasis)
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
        core = self._tail.rstrip(CLOSERS)
        return self._end_block(period=False) if core and core[-1] in TERMINAL else " "

    def _emit(self, text: str) -> str:
        """Speech text out, its marks from markup (``BREAK``, ``ITEM_END``, ``CELL``,
        ``HUSH``) made sentence marks and commas."""
        out: list[str] = []
        for index, part in enumerate(MARKS_RE.split(text)):
            if index % 2:  # a mark
                if part == CELL:
                    self._comma = bool(self._tail) and self._tail[-1] not in TERMINAL | {","}
                elif part == HUSH:  # a finished sentence is not held back by what is not spoken
                    if self._tail.rstrip(CLOSERS)[-1:] in FINAL:
                        out.append(self._end_block(period=False))
                else:
                    out.append(self._end_block(period=part == ITEM_END))
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
        core, end = self._tail.rstrip(CLOSERS), ""
        if period and (not core or core[-1] not in TERMINAL):
            end = "。" if core and HAN_KANA_RE.match(core[-1]) else "."
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
    parts = (tidy(p) for c in cells for p in MARKS_RE.split(_inline(c).replace(HUSH, ""))[::2])
    return ", ".join(p for p in parts if p)


def _inline_prefix(
    text: str, complete: bool, left: str, emphasis: _Emphasis
) -> tuple[str, int, re.Pattern[str] | None]:
    """Speech text of the longest decided prefix of (the rest of) a line, its length, and
    the end to look for when it ends with the start of a comment or hidden element.

    ``left`` is the raw character before ``text`` on its line (" " at the line start);
    ``emphasis``, the "*" runs open on the line before it and the text they hold (updated).
    Undecided, and held back: a link or code span not closed yet, a last word that is or
    may become a URL, markup characters at the end (``**`` may continue), and a ``<`` or
    ``&`` that may still become a tag or an entity.
    """
    if complete:
        for token in _INLINE_RE.finditer(left + text, 1):  # (as _inline reads it)
            if hidden := hides(token):
                return _inline(text[: token.end() - 1], left, emphasis), token.end() - 1, hidden
        return _inline(text, left, emphasis), len(text), None
    cut = word = floor = i = 0  # floor: the end of the last entity, never cut inside
    while i < len(text):
        if i and _splits(text[i - 1]):
            cut = word = i
        elif i and text[i - 1].isalnum():
            cut = i
        if text[i] in "<&":
            match = _INLINE_RE.match(text, i)
            if match and match["entity"] and match.end() == len(text) and text[-1] != ";":
                break  # a reference without ';' may go on ("&amp" -> "&ampx", "&#6" -> "&#65")
            if match and match["url"] is None:  # a tag, comment, mail address or entity
                if hidden := hides(match):
                    return _inline(text[: match.end()], left, emphasis), match.end(), hidden
                i = cut = floor = match.end()  # (an entity may be part of a URL: the word goes on)
                word = word if match["entity"] else i
                continue
            if not match and len(text) - i < MAX_HELD_CHARS and may_become_markup(text[i:]):
                break
        elif text[i] == "`" or text.startswith("[", i) or text.startswith("![", i):
            match = _INLINE_RE.match(text, i)
            closed = match and (match["link"] is not None or (match["code"] and match.end() < len(text)))
            if match and closed:  # (a closing backtick at the end may be part of a longer run)
                i = cut = word = match.end()
                continue
            open_construct = text[i] == "`" or _PARTIAL_LINK_RE.fullmatch(text, i)
            if open_construct and len(text) - i < MAX_HELD_CHARS:
                break
        i += 1
    else:
        if text and (_splits(text[-1]) or text[-1].isalnum()):
            cut = len(text)
    for start in range(word, cut):  # hold a URL, or what may become one, from its start
        glued = _URL_GLUE_RE.match(text[start - 1] if start else left)
        if not glued and _URL_START_RE.match(text, start) and len(text) - start < MAX_HELD_CHARS:
            cut = start
            while cut > max(word, floor) and not (text[cut - 1].isalnum() or _splits(text[cut - 1])):
                cut -= 1  # markup before it is decided with what follows
            break
    return _inline(text[:cut], left, emphasis), cut, None


def _splits(char: str) -> bool:
    """Whether a word ends after ``char``: whitespace, or a CJK character or mark."""
    return char.isspace() or bool(CJK_RE.match(char)) or char in "。！？，、：；"


def _inline(text: str, left: str = " ", emphasis: _Emphasis | None = None) -> str:
    """Inline markdown of decided text -> speech text (see the module docstring); ``left``
    is the raw character before ``text``, which the patterns' lookbehinds see as they
    would in the whole line ("2" + "http://": no URL, as in "2http://"). With ``emphasis``
    (the "*" runs open before ``text`` on its line, updated), the speech text after a run
    still open is held there; without, ``text`` is all there is (a cell, a link's text)."""
    own = emphasis is None
    emphasis = _Emphasis() if emphasis is None else emphasis
    line, last = left + text, 1
    for match in _INLINE_RE.finditer(line, 1):
        emphasis.add(line[last : match.start()])
        emphasis.add(_inline_sub(match, emphasis))
        last = match.end()
    emphasis.add(line[last:])
    emphasis.read(len(text))
    return _EMOJI_RE.sub(" ", emphasis.end() if own else emphasis.decided())


def _inline_sub(match: re.Match[str], emphasis: _Emphasis) -> str:
    """What one token of ``_INLINE_RE`` is read as; ``match.string`` starts with the raw
    character before the text; ``emphasis``: the "*" runs open on the line (updated)."""
    if match["code"]:
        code = match["code_text"].strip()
        return code if len(code) <= MAX_SPOKEN_CODE_CHARS else " "
    if match["link"] is not None:
        return _inline(match["label"])
    if match["url"]:
        return _domain(match["url"])
    if match["comment"] is not None:
        return HUSH
    if match["hidden"] is not None:  # (its content is dropped by the reader, or here)
        return _attribute(match["hidden_attrs"], "alias") if match["hidden_name"] == "sub" else HUSH
    if match["tag"] is not None:
        return _tag(match["tag_name"], match["attrs"] or "", closing=match["tag"].startswith("</"))
    if match["mail"] is not None:
        return match["address"]
    if match["entity"] is not None:
        decoded = html.unescape(match["entity"])
        return decoded.translate(ENTITY_TEXT) if decoded != match["entity"] else decoded
    marker, text = match["marker"], match.string
    before = text[match.start() - 1]
    after = text[match.end()] if match.end() < len(text) else " "
    if marker[0] == "_" and before.isalnum() and after.isalnum():
        return marker  # snake_case and a_b@c.de keep their underscores
    if marker[0] == "*" and before.isspace() and after.isspace():
        return marker  # "5 * 3", "2 ** 8": no emphasis opens or closes at spaces on both sides
    if marker[0] == "*" and (before.isdigit() or before == ")") and (after.isdigit() or after == "("):
        return marker  # "2*3", "(1+2)*3", "2**8": arithmetic (CommonMark would let "2*3*4" be emphasis)
    if marker[0] == "*" and _OPERAND_RE.match(text, match.end()) and (before.isdigit() or before == ")"):
        return marker  # "-5*-3", "2*$3": a signed number or an amount after it is arithmetic too
    if marker[0] == "*":
        return emphasis.run(marker, before, after, match.start() - 1)
    return ""


#: What may follow a "*" between numbers: a sign or currency sign, then a digit.
_OPERAND_RE = re.compile(r"[-+−]?[$€£¥₹]?\d")

#: Characters of a line after a "*" run that opens emphasis within which its closer must
#: begin; a run not closed by then is text. Long enough for an italic paragraph (a role-play
#: action, a disclaimer), short enough that a lone "*" in a long line ("a *b ...") holds the
#: speech after it back by about two segments at most, not to the end of its line.
MAX_EMPHASIS_CHARS = 600


@dataclass
class _Run:
    """A "*" run open as emphasis on a line: ``left`` of its ``size`` stars not closed yet,
    standing at ``slot`` in ``_Emphasis``'s held parts; it began at ``position`` (characters
    of the line), and ``closes`` says whether it could close too (CommonMark's "both")."""

    left: int
    slot: int
    position: int
    size: int
    closes: bool

    def pairs(self, size: int, opens: bool) -> bool:
        """Whether a closing run of ``size`` stars, which may also open if ``opens``, may
        close this one: CommonMark's rule of 3 (rules 9 and 10 of emphasis)."""
        return not (opens or self.closes) or (self.size + size) % 3 != 0 or self.size % 3 == size % 3 == 0


class _Emphasis:
    """The "*" runs open as emphasis on a line, and the speech text held since the first of
    them: whether a run is emphasis is known only once its closer comes, so the text after
    an open run waits for it, with the run's stars in their place; a run that is never
    closed (by the line's end, or within ``MAX_EMPHASIS_CHARS``) keeps its stars there.

    Positions are counted in the characters of the line read so far (``read``), so the
    runs and their ends are the same however the line arrived.
    """

    def __init__(self) -> None:
        self._parts: list[str] = []  # speech text since the first open run (all, without one)
        self._runs: list[_Run] = []  # open, innermost last
        self._column = 0  # characters of the line read before the current text

    def add(self, speech: str) -> None:
        """Speech text that follows what was added before."""
        if speech:
            self._parts.append(speech)

    def read(self, chars: int) -> None:
        """The current text, ``chars`` long, is read: the next starts after it; runs whose
        closer could only begin after their limit are text."""
        self._column += chars
        self._expire(self._column)

    def decided(self) -> str:
        """The speech text no open run holds back (taken)."""
        held = self._runs[0].slot if self._runs else len(self._parts)
        if not held:
            return ""
        out = "".join(self._parts[:held])
        del self._parts[:held]
        for run in self._runs:
            run.slot -= held
        return out

    def end(self) -> str:
        """The line ends: all the speech text held, runs still open kept as their stars."""
        out = "".join(self._parts)
        self._parts, self._runs, self._column = [], [], 0
        return out

    def run(self, marker: str, before: str, after: str, position: int) -> str:
        """A run of "*" (not arithmetic) at ``position`` in the current text, read by
        CommonMark's flanking rules and its "process emphasis" steps: "" when all its stars
        open or close emphasis (an opening run stands in the held text as its stars until it
        closes), else the stars that do neither, as text.

        It may open when ``after`` (the raw character after it; " " at the line's end) is
        no space, and is a letter or digit or ``before`` is a space or punctuation; it may
        close in the mirror case. One that may close takes the innermost open run it may
        pair with (not when either may both open and close and their lengths add up to a
        multiple of 3, unless both are multiples of 3: "a**b*" is text), two stars from each
        if both have two, else one; the stars left on the open run wait for another closer
        or stay as text ("**a*" is "*" + italic "a"), those left on this one close the next
        open run out ("*a **b***") or stay as text ("*a**" is italic "a" + "*"). The runs inside the one
        it closes stay text ("*a b**c d*"). Stars left that may open wait as an open run;
        others are text ("Rated 5* by users")."""
        position += self._column
        self._expire(position)
        opens = not after.isspace() and (after.isalnum() or before.isspace() or not before.isalnum())
        closes = not before.isspace() and (before.isalnum() or after.isspace() or not after.isalnum())
        size, runs = len(marker), self._runs
        left = size
        while closes and left:
            index = next((i for i in range(len(runs) - 1, -1, -1) if runs[i].pairs(size, opens)), None)
            if index is None:
                break
            opener = runs[index]
            used = 2 if left >= 2 and opener.left >= 2 else 1
            opener.left -= used
            left -= used
            del runs[index + (opener.left > 0) :]  # (the runs inside it stay as their stars)
            self._parts[opener.slot] = "*" * opener.left
        if not left:
            return ""
        if opens:
            runs.append(_Run(left, len(self._parts), position, size, closes))
            self._parts.append("*" * left)
            return ""
        return "*" * left

    def _expire(self, position: int) -> None:
        """Runs that opened more than ``MAX_EMPHASIS_CHARS`` before ``position`` are text."""
        while self._runs and self._runs[0].position + MAX_EMPHASIS_CHARS < position:
            del self._runs[0]


def _tag(name: str | None, attributes: str, closing: bool) -> str:
    """What a tag is read as: a mark for a block, item or cell, an image's alt text, else
    nothing (inline HTML, SSML wrappers, declarations). A ``<break>`` of no strength or no
    time is no break. A closing ``</think>`` (``</script>``, ``</style>``) with no opening
    one ends a phrase: a reasoning model whose prompt opened its thoughts writes only the
    closing tag, between its thoughts and its answer."""
    if name in CELL_TAGS:
        return CELL
    if closing and name in HIDDEN_TAGS:  # a stray "</think>": the thoughts opened in the prompt end
        return BREAK
    if name in (ITEM_TAGS | LIST_TAGS if closing else OPEN_ITEM_TAGS):
        return ITEM_END
    if name == "break" and SILENT_BREAK_RE.search(attributes):
        return ""
    if name in BREAK_TAGS or name in ITEM_TAGS:  # (a heading's start: like a block's)
        return BREAK
    return f" {_attribute(attributes, 'alt')} " if name == "img" else ""


def _attribute(attributes: str, name: str) -> str:
    """The speech text of an attribute's value ("" when absent)."""
    for match in ATTRIBUTE_RE.finditer(attributes):
        if match[1].lower() == name:
            value = match[2][1:-1] if match[2][0] in "\"'" else match[2]
            return MARKS_RE.sub(" ", _inline(value))
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

