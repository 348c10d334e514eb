"""HTML and SSML markup in an LLM's reply: what is a tag, an entity or a comment, and what
may still become one while deltas arrive.

LLM replies carry ``<br>`` in tables, ``<sup>``, ``<details>`` and entities; Home Assistant
users send SSML out of habit. They are read as a browser shows them: tags are not spoken,
the text inside them is; block tags, ``<br>`` and SSML ``<break>`` end a phrase, list
items, headings and table rows a sentence, table cells a comma; character references are
decoded (numeric ones and HTML5's legacy names, ``&amp``, ``&lt``, ``&copy``, also without
their ';', as a browser does, while "AT&T", "R&D" and "&notebook" stay prose; references to
no character or to a control are dropped); ``<script>``,
``<style>``, ``<think>`` and comments are not spoken, across lines, and a finished sentence
before them is not held back by them; a tag's attributes may go on over lines;
``<name@example.com>`` is read without its brackets. Only lowercase known tag names (and
namespaced ones) open a tag, and an attribute needs a value unless it is a boolean one, so
angle brackets that open no known tag ("a < b", "x<5", "<3", "Vec<T>", "press <A>", "a<b
and c>d") stay prose.

This module holds that vocabulary and grammar: the tag-name sets, the ``MARKUP`` pattern
that the markdown reader's inline pattern embeds, the marks (``BREAK``, ``ITEM_END``,
``CELL``, ``HUSH``) that the reader turns into sentence ends and commas, and the streaming
helpers (``hides``, ``hidden_upto``, ``may_become_markup``, ``unfinished_tag``) that say
what to hold back or drop while a tag, entity, comment or hidden element may still be
arriving, and what of it to drop when the text ends before it does. What a tag is read as
is left to ``markdown.py`` (an attribute's value is read as inline markdown there),
sentences and segments to ``segmenter.py``.
"""

from __future__ import annotations

import re
from html.entities import html5

from .writing import SILENT, SPACES

#: Longest text held back while markup, a link, inline code or a URL may still close, in
#: characters (bounds the work per delta; longer ones are read as plain text). The markdown
#: reader holds its links, code spans and URLs to this bound too.
MAX_HELD_CHARS = 300

#: Marks in the reader's inline speech text (private-use characters, removed from the input):
#: a phrase ends; an item, heading or table row ends as a sentence; a table cell ends.
BREAK, ITEM_END, CELL = "\ue000", "\ue001", "\ue002"
#: Mark: an unspoken block (a comment, ``<script>``, ``<style>``, ``<think>``) begins here; a
#: finished sentence before it ends there, so that it is spoken before the block is over.
HUSH = "\ue003"
MARKS_RE = re.compile(f"([{BREAK}{ITEM_END}{CELL}{HUSH}])")
#: No mark of the reader's: the segmenter's stand-in for a "*" of the speech text while
#: sentence-stream holds it (sentence-stream takes "*...*" for emphasis and drops it, so
#: "5 * 3 * 4" came out "5 3 4"; the reader has already read what is emphasis). Removed
#: from the input as the marks are, so none ever comes out of the reader.
ASTERISK = "\ue004"
#: What the reader makes of its raw input, character by character (so however it is split):
#: the marks above, ``ASTERISK`` and the characters that are no text (``writing.SILENT``:
#: controls, invisible format characters, U+FFFD, non-characters) dropped, whitespace
#: controls other than tab, newline and carriage return (``writing.SPACES``) made spaces.
INPUT_TEXT = str.maketrans(
    dict.fromkeys(SPACES, " ") | dict.fromkeys([*SILENT, BREAK, ITEM_END, CELL, HUSH, ASTERISK])
)
#: Tags that end a phrase (a pause, no period added): blocks, ``<br>``, SSML ``<break>``,
#: ``<p>`` and ``<s>`` (HTML's strikethrough ``<s>`` too: its words are still spoken).
BREAK_TAGS = frozenset(
    "address article aside blockquote body br break center details dialog div dl fieldset figcaption "
    "figure footer form header hgroup hr html legend main menu nav ol p pre s search section table "
    "tbody tfoot thead ul".split()
)
#: Tags that end their text as a sentence, like a markdown list item, heading or table row.
ITEM_TAGS = frozenset("caption dd dt h1 h2 h3 h4 h5 h6 li summary tr".split())
#: Items whose start also ends the item before, which HTML lets stay open ("<li>a<li>b").
OPEN_ITEM_TAGS = frozenset("dd dt li tr".split())
CELL_TAGS = frozenset(("td", "th"))
#: Containers whose end also ends an item left open ("<li>two</ul>": "two.").
LIST_TAGS = frozenset("dl ol table tbody tfoot thead ul".split())
#: Elements whose content is not spoken (as a browser shows none of it; ``<think>`` holds a
#: reasoning model's thoughts), up to their closing tag or the end of the text.
HIDDEN_TAGS = ("script", "style", "think")
#: Every other tag known: dropped, its text spoken (SSML wrappers, inline HTML). Tags are
#: lowercase, as LLMs and SSML write them: "press <A>" and "Vec<T>" stay prose.
_INLINE_TAGS = frozenset(
    "a abbr audio b bdi bdo big button cite code data del desc dfn em emphasis font head i iframe "
    "img input ins kbd label lang lexicon link mark media meta metadata meter nobr noscript object "
    "option output par phoneme picture progress prosody q rp rt ruby samp say-as select seq small "
    "source span speak strike strong sub sup svg template textarea time title token track tt u var "
    "video voice w wbr".split()
)
_TAG_NAMES = BREAK_TAGS | ITEM_TAGS | CELL_TAGS | _INLINE_TAGS | set(HIDDEN_TAGS)
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
_VALUE = r"""(?:"[^"<]*"|'[^'<]*'|[^\s"'=<>`]+)"""
_ATTRIBUTES = rf"(?:\s+(?:[A-Za-z_:][\w:.-]*\s*=\s*{_VALUE}|(?:{_BOOLEAN_ATTRIBUTES})(?![\w:.-])))*"
#: Named references that HTML5 decodes without their ';' (``&amp``, ``&lt``, ``&copy``, the
#: Latin-1 letters), as a browser and ``html.unescape`` do; not followed by a letter (HTML5's
#: rule inside attribute values, for all text here: "&notebook" and "this&copyright" stay),
#: and none of the all-capital ones (``&AMP``, ``&ETH``, ``&REG``...): after "&" capitals are
#: an acronym ("BTC&ETH", "AT&T"), and no one writes references in capitals without ';'.
_LEGACY_NAMES = "|".join(
    sorted((name for name in html5 if not name.endswith(";") and not name.isupper()), key=len, reverse=True)
)
MARKUP = (
    r"(?P<comment><!--(?P<comment_end>.*?-->)?)"  # an open one hides the lines up to "-->"
    rf"|(?P<hidden><(?P<hidden_name>{'|'.join(HIDDEN_TAGS)}|sub(?=[^<>]*\salias\s*=))(?![\w:-])"
    rf"(?P<hidden_attrs>{_ATTRIBUTES})\s*>(?P<hidden_end>.*?</(?P=hidden_name)\s*>)?)"
    rf"|(?P<tag></?(?P<tag_name>{_NAME})(?P<attrs>{_ATTRIBUTES})[\s/]*>|<![A-Za-z][^<>]*>|<\?[^<>]*\?>)"
    r"|(?P<mail><(?P<address>[\w.+-]+@[\w-]+(?:\.[\w-]+)+)>)"
    r"|(?P<entity>&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});"
    rf"|&(?:#[0-9]{{1,7}}(?![0-9])|#[xX][0-9a-fA-F]{{1,6}}(?![0-9a-fA-F])|(?:{_LEGACY_NAMES})(?![A-Za-z])))"
)
#: Text from a "<" or "&" that may still become markup once more characters arrive.
_PARTIAL_MARKUP_RE = re.compile(
    r"&(?:#[xX]?[0-9a-fA-F]{0,7}|[A-Za-z][A-Za-z0-9]{0,31})?"
    r"|<(?:!(?:-|[A-Za-z][^<>]*)?|\?[^<>]*|[\w.+-]*(?:@[\w.-]*)?)"
    r"|</?(?:(?P<name>[a-z][\w:-]*)"
    r"""(?P<attrs>(?:\s+[A-Za-z_:][\w:.-]*(?:\s*=\s*(?:"[^"<]*"?|'[^'<]*'?|[^\s"'=<>`]*))?)*[\s/]*))?"""
)
ATTRIBUTE_RE = re.compile(rf"""([A-Za-z_:][\w:.-]*)\s*=\s*("[^"<]*"|'[^'<]*'|[^\s"'=<>`]+)""")
#: A ``<break>`` that is no pause: no strength, or no time.
SILENT_BREAK_RE = re.compile(
    r"""\bstrength\s*=\s*["']?(?:none|x-weak)\b|\btime\s*=\s*["']?0*(?:\.0*)?m?s\b"""
)
#: Decoded entities that are spaces or no text: no-break space and whitespace controls,
#: newlines too (an entity never starts a markdown line); the reader's marks and
#: ``ASTERISK``; and the characters that are no text (``writing.SILENT``), among them what
#: ``html.unescape`` makes of references to no character (U+FFFD for ``&#0;``, a surrogate
#: or a number past U+10FFFF) or to a control character (``&#x81;``), which a browser shows
#: as no text or a replacement glyph and the model cannot say. Literal text gets the same
#: rule (``INPUT_TEXT``).
ENTITY_TEXT = str.maketrans(
    dict.fromkeys([*SPACES, "\xa0", "\t", "\n", "\r"], " ")
    | dict.fromkeys([*SILENT, BREAK, ITEM_END, CELL, HUSH, ASTERISK])
)


def hides(match: re.Match[str]) -> re.Pattern[str] | None:
    """The end to look for when ``match`` opens a comment or hidden element that does not
    end in the same text; else None."""
    if match["comment"] is not None and match["comment_end"] is None:
        return re.compile("-->")
    if match["hidden"] is not None and match["hidden_end"] is None:
        return re.compile(rf"</{match['hidden_name']}\s*>")
    return None


def hidden_upto(text: str, start: int) -> int:
    """How much of ``text`` inside a comment or hidden element may be dropped while its end
    has not come: all but what may still begin it (a last ``<``, trailing dashes)."""
    keep = len(text) - min(2, len(text) - len(text.rstrip("-")))
    bracket = text.rfind("<", start)
    if bracket >= 0 and ">" not in text[bracket:] and len(text) - bracket < MAX_HELD_CHARS:
        keep = min(keep, bracket)
    return max(start, keep)


def may_become_markup(text: str) -> bool:
    """Whether ``text``, from a ``<`` or ``&`` to the end of what has come, may still become
    a tag, comment, declaration, mail address or entity."""
    match = _PARTIAL_MARKUP_RE.fullmatch(text)
    if match is None:
        return False
    name = match["name"]
    if name is None or not match["attrs"]:
        return True  # the name may still grow (into a namespaced one too)
    return name in _TAG_NAMES or ":" in name


def unfinished_tag(text: str) -> int:
    """Where a tag begun but not finished at the very end of ``text`` starts, when it can
    only be markup; else ``len(text)``. At the end of the text it is dropped, as a browser
    drops it: a closing tag of a known name or the start of one ("hi</b", "</spe"), an
    opening tag of a known name once an attribute value or a "/" has begun ('<break
    time="1', "<br /"), or that is its whole rest and longer than a letter ("<br"); a
    declaration or processing instruction ("<!DOC", "<?xml"). Prose stays: "a</", "a </ b",
    "if a<b", "x<b and c", "Vec<T", "</x"."""
    start = text.rfind("<")
    tail = text[start:].rstrip()
    if start < 0 or not may_become_markup(tail):
        return len(text)
    tag = re.fullmatch(r"<(/?)([a-z][\w:-]*)(.*)", tail, re.S)
    if tag is None:
        return start if re.match(r"<(?:!-|![A-Za-z]|\?[A-Za-z])", tail) else len(text)
    closing, name, rest = tag.groups()
    known = name in _TAG_NAMES or ":" in name
    if closing:
        certain = known or any(known_name.startswith(name) for known_name in _TAG_NAMES)
    else:
        certain = known and ("=" in rest or "/" in rest or (not rest and len(name) > 1))
    return start if certain else len(text)

