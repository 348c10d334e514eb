"""The text front end: markdown to speech, sentence segments of whole and streamed text, budgets."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

import pytest
from sentence_stream import SentenceBoundaryDetector

from wyoming_qwen3tts.text import segmenter as text_module
from wyoming_qwen3tts.text.writing import MAX_ESCAPE_CHARS
from wyoming_qwen3tts.text.markdown import MAX_EMPHASIS_CHARS
from wyoming_qwen3tts.common.vocabulary import MAX_SEGMENT_SECONDS
from wyoming_qwen3tts.text.segmenter import (
    MarkdownReader,
    Segmenter,
    clean_text,
    estimated_seconds,
    frame_budget,
    run_on_cut,
    split_long,
)


def segments(*deltas: str, streamed: bool = False) -> list[str]:
    segmenter = Segmenter(streamed=streamed)
    return [s for d in deltas for s in segmenter.add(d)] + segmenter.finish()


def splits(text: str) -> list[list[str]]:
    """The text as one delta, one character per delta, and deltas of random lengths."""
    rng = random.Random(text.encode("utf-8", "surrogatepass"))  # (the same seed as the text's own)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, len(text) // 3)))
    return [[text], list(text), [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]]


#: LLM-style replies and the sentences they are spoken as (whole text, or streamed by any deltas
#: for a non-streamed request).
REPLIES: list[tuple[str, str, list[str]]] = [
    ("en", "Here are 3 tips:\n- drink water\n- sleep", ["Here are 3 tips:", "drink water.", "sleep."]),
    ("en", "**Sure!** Here is the *forecast* for today.", ["Sure!", "Here is the forecast for today."]),
    ("en", "The model is called TTS. This works", ["The model is called TTS.", "This works"]),
    ("en", "Yes. I did. Dr. Smith agreed.", ["Yes.", "I did.", "Dr. Smith agreed."]),
    (
        "en",
        "## Weather\nIt is 22.5°C and **sunny** ☀️. See [the forecast](https://example.com/w?x=1) "
        "or https://www.met.no/en/weather.\n",
        ["Weather.", "It is 22.5°C and sunny.", "See the forecast or met.no."],
    ),
    (
        "en",
        "Run this:\n```bash\npip install wyoming\n```\nThen pick the `aria` voice 🎉!",
        ["Run this:", "Then pick the aria voice!"],
    ),
    (
        "en",
        "| Room | Temp |\n|------|-----:|\n| Kitchen | 21 °C |\n| Hall | 19 °C |\n\nAll good.",
        ["Room, Temp.", "Kitchen, 21 °C.", "Hall, 19 °C.", "All good."],
    ),
    ("en", "It costs $12.50, about 20% less. Done", ["It costs $12.50, about 20% less.", "Done"]),
    (
        "de",
        "**Gerne!** Hier sind die Schritte:\n1. Licht aus\n2. Fenster zu\n\nDas Wetter: 22,5 Grad. Schön, oder?",
        ["Gerne!", "Hier sind die Schritte:", "Licht aus.", "Fenster zu.", "Das Wetter: 22,5 Grad.", "Schön, oder?"],
    ),
    ("de", "Das kostet 3,50 € pro Stück. Fr. Schmidt zahlt.", ["Das kostet 3,50 € pro Stück.", "Fr. Schmidt zahlt."]),
    (
        "fr",
        "Voici la liste :\n- pommes\n- poires\n\nBon appétit ! Il fait 18 °C à Paris.",
        ["Voici la liste:", "pommes.", "poires.", "Bon appétit!", "Il fait 18 °C à Paris."],
    ),
    ("fr", "« Bonjour. » Comment allez-vous ?", ["« Bonjour. »", "Comment allez-vous?"]),
    (
        "zh",
        "今天天气很好。**注意**：明天下雨！\n- 多喝水\n- 早点睡",
        ["今天天气很好。", "注意：明天下雨！", "多喝水。", "早点睡。"],
    ),
    ("zh", "# 天气预报\n温度是22.5度，湿度60%。详情见https://weather.com.cn/a。", ["天气预报。", "温度是22.5度，湿度60%。", "详情见weather.com.cn。"]),
    ("ja", "こんにちは、元気ですか？**はい**、元気です。\n* りんご\n* みかん", ["こんにちは、元気ですか？", "はい、元気です。", "りんご。", "みかん。"]),
    ("es", "¿Cómo estás? ¡Muy bien! Gracias.", ["¿Cómo estás?", "¡Muy bien!", "Gracias."]),
    ("ko", "안녕하세요. **오늘** 날씨는 맑습니다.", ["안녕하세요.", "오늘 날씨는 맑습니다."]),
    ("ru", "Да. Сегодня +5 °C, ветер 3 м/с.", ["Да.", "Сегодня +5 °C, ветер 3 м/с."]),
]


@pytest.mark.parametrize(("language", "text", "expected"), REPLIES, ids=[f"{r[0]}-{i}" for i, r in enumerate(REPLIES)])
def test_replies_become_sentences_however_they_are_split(language: str, text: str, expected: list[str]) -> None:
    for deltas in splits(text):
        assert segments(*deltas) == expected, deltas


@pytest.mark.parametrize(
    ("rule", "raw", "clean"),
    [
        ("bold and italic vanish", "**Bold**, *italic*, ***both***, __strong__ and ~~gone~~", "Bold, italic, both, strong and gone"),
        ("snake_case and mail stay", "Mail a_b@c.de about snake_case", "Mail a_b@c.de about snake_case"),
        ("heading and items end as sentences", "# Heading\n- item one\n- item two", "Heading. item one. item two."),
        ("numbered heading", "### 2. Install\nDo it.", "Install. Do it."),
        ("numbered items and bullets", "1) one\n2. two\n• three\n+ four", "one. two. three. four."),
        ("quote markers vanish", "> Quoted\n> text.", "Quoted text."),
        ("thematic break", "Before\n\n---\nAfter", "Before After"),
        ("setext heading underline", "Title\n=====\nText", "Title Text"),
        ("a spaced asterisk is no markup", "5 * 3 = 15, *not* 16, x * y", "5 × 3 = 15, not 16, x * y"),
        ("a product is no emphasis", "2*3*4 = 24, (1+2)*3 and 2 ** 8, *x*", "2×3×4 = 24, (1+2)×3 and 2 ** 8, x"),
        ("a power is no emphasis", "2**8 = 256, **bold**2", "2**8 = 256, bold2"),
        ("link read as its text", "See [the docs](https://example.com/x \"Docs\") now", "See the docs now"),
        ("image read as its alt text", "![a red car](car.png) drove by", "a red car drove by"),
        ("bare URL read as its domain", "Visit https://www.example.com/a/b?c=d. Then", "Visit example.com. Then"),
        ("www URL and autolink", "Go to www.test.org or <https://a.io/x>.", "Go to test.org or a.io."),
        ("short inline code read", "Use `aria` here", "Use aria here"),
        ("long inline code skipped", "Run `pip install -c constraints.txt .` now", "Run now"),
        ("code block skipped", "Before:\n~~~\nx = 1\n~~~\nafter", "Before: after"),
        ("table read row by row", "| a | b |\n|:-|-:|\n| 1 | **2** |", "a, b. 1, 2."),
        ("emoji and pictographs removed", "Party time 🎉🎉! 👍🏽 ok ✅ → done 🇩🇪", "Party time! ok done"),
        ("emoji only", "🎉", ""),
        ("a lone code block is nothing", "```\ncode\n```", ""),
        ("meaningful symbols kept", "22.5°C, 50%, 3 € / $4 / £5 / ¥6, A&B, 1+1=2", "22.5°C, 50%, 3 € / $4 / £5 / ¥6, A&B, 1+1=2"),
        ("emoticons kept", "Hi :-) ;)", "Hi :-) ;)"),
        ("CJK punctuation after removed markup", "**注意**：明天下雨！", "注意：明天下雨！"),
        ("CJK list item gets 。", "- 早点睡", "早点睡。"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v and len(v) < 40 else "",
)
def test_markdown_rules(rule: str, raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


@pytest.mark.parametrize(
    "text",
    [
        "**Sure!** See [the docs](https://example.com/docs/x) and `code` or https://www.example.org/a.\n- ***item*** one\n",
        "# Title\n| a | b |\n|---|---|\n| **1** | [x](http://y.z) |\n```py\nprint('*')\n```\n~~old~~ __new__ 🎉",
    ],
)
def test_streaming_never_emits_half_a_markup_token(text: str) -> None:
    for deltas in splits(text)[1:]:
        reader = MarkdownReader()
        emitted = ""
        for delta in deltas:
            emitted += reader.feed(delta)
            for token in ("*", "`", "[", "](", "://", "#", "|", "~", "__", "print"):
                assert token not in emitted, (token, emitted)
        assert " ".join((emitted + reader.close()).split()) == clean_text(text)


@pytest.mark.parametrize(
    ("rule", "raw", "clean"),
    [
        ("SSML speak and break", '<speak>Hello <break time="1s"/> there.</speak>', "Hello there."),
        ("inline HTML keeps its text", 'Say <b>bold</b>, <i>it</i> and <a href="https://x.io/a">a link</a>', "Say bold, it and a link"),
        ("SSML wrappers keep their text", '<speak><prosody rate="slow"><emphasis level="strong">Now</emphasis></prosody>'
         ' <say-as interpret-as="characters">TTS</say-as>, <voice name="x"><lang xml:lang="en-US">ok</lang></voice></speak>',
         "Now TTS, ok"),
        ("vendor SSML tags", '<amazon:effect name="whispered">Quiet</amazon:effect> <mstts:express-as style="cheerful">now</mstts:express-as>', "Quiet now"),
        ("SSML sub reads its alias", 'The <sub alias="World Wide Web">WWW</sub> grew', "The World Wide Web grew"),
        ("a > inside a quoted value", "<span title='a>b'>inside</span> out, <b data-x=\"1>2\">bold</b>", "inside out, bold"),
        ("entities decoded", "Fish &amp; chips&nbsp;for&#160;two, &lt;3, &#8364;5, &#x41;&quot;", 'Fish & chips for two, <3, €5, A"'),
        ("unknown entities kept", "AT&T, Q&A, R&D, &bogus;, &notebook", "AT&T, Q&A, R&D, &bogus;, &notebook"),
        ("references without ';' as a browser reads them", "&copy 2024, a &amp b, &lt3, &#65&#x42, &#67x", "© 2024, a & b, <3, AB, Cx"),
        ("script and style not spoken", "<style>p { color: red; }</style>Hi <script>alert('x')</script>there", "Hi there"),
        ("comment not spoken", "Hello <!-- a note --> world", "Hello world"),
        ("declarations not spoken", '<?xml version="1.0"?><!DOCTYPE html><speak>Hi</speak>', "Hi"),
        ("image read as its alt text", '<img src="car.png" alt="A red car"> drove by', "A red car drove by"),
        ("mail autolink loses its brackets", "Mail John <john.doe@example.com> today", "Mail John john.doe@example.com today"),
        ("comparisons are prose", "If a < b and c > d, x<5 or y>3", "If a < b and c > d, x<5 or y>3"),
        ("hearts and arrows are prose", "I <3 you -> a => b <- c <= d", "I <3 you -> a => b <- c <= d"),
        ("generics and capitals are no tags", "Vec<T>, Map<String, Integer>, press <A> then <B>", "Vec<T>, Map<String, Integer>, press <A> then <B>"),
        ("a tag name with words after it is prose", "if a<b and c>d then", "if a<b and c>d then"),
        ("markup in inline code is read as code", "Use `<br>` or `<style>` here", "Use <br> or <style> here"),
        ("markup in a code block is skipped", "Try:\n```html\n<script>\n<b>x</b>\n```\nDone.", "Try: Done."),
        ("markdown and markup together", "**Sure!** <b>Here</b> is `aria` &amp; [docs](https://a.io)", "Sure! Here is aria & docs"),
        ("a tag over several lines", '<a\nhref="https://x">link</a> and <img\n  src="car.png"\n  alt="A red\ncar"\n/> drove', "link and A red car drove"),
        ("closing and hidden tags over lines", "<b\n>Hi</b\n> <think\n>hidden</think\n>there <speak\nxml:lang='en'>now", "Hi there now"),
        ("a code block ends a tag begun in it", '```html\n<a title="x\n```\nSay "> hi.', 'Say "> hi.'),
        ("an unspoken block in a table cell", "| Done. <!-- x --> now | <think>y</think>c |", "Done. now, c."),
        ("prose over lines stays prose", "if a<b\nand c>d, or x <b\n\nclass='y'> z", "if a<b and c>d, or x <b class='y'> z"),
        ("self-closing forms browsers accept", "One<br / >two<br/ >three<br //>four<img alt='five' / >", "One two three four five"),
        ("an unfinished closing tag at the end", "<speak>Hi <b>there</b", "Hi there"),
        ("the start of a known closing tag at the end", "<speak>Hello</spe", "Hello"),
        ("an opening tag begun at the end", '<speak>Hi <break time="1', "Hi"),
        ("a bare known tag name at the end", "Roses are red<br", "Roses are red"),
        ("a declaration begun at the end", "Done.<!DOC", "Done."),
        ("prose like a tag at the end stays", "a </ b, Vec<T", "a </ b, Vec<T"),
        ("a one-letter tag name at the end is prose", "if a<b", "if a<b"),
        ("a word after a tag name at the end is prose", "if x<b and c", "if x<b and c"),
        ("an unknown closing name at the end is prose", "a</ or y</x", "a</ or y</x"),
        ("references to no character are dropped", "a&#0;b&#xD800;c&#x110000;d&#xFFFD;e", "abcde"),
        ("references to controls are dropped", "a&#1;b&#x81;c&#127;d&#x9D;e&#9;f", "abcde f"),
        ("Windows-1252 references read as a browser does", "&#128;5 and &#x99;", "€5 and ™"),
        ("a closing think tag alone parts its words", "Before</think>after and a</script>b</style>c", "Before after and a b c"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v and len(v) < 40 else "",
)
def test_markup_rules(rule: str, raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<speak>Hello <break time="1s"/> there.</speak>', ["Hello", "there."]),
        ('One<break strength="none"/> two<break time="0ms"/> three.', ["One two three."]),
        ("Roses are red<br>Violets are blue<br/>", ["Roses are red", "Violets are blue"]),
        ("<p>First</p><p>Second</p>", ["First", "Second"]),
        ("<speak><s>Hi there.</s><s>How are you?</s></speak>", ["Hi there.", "How are you?"]),
        ("<h2>Title</h2>Text<ul><li>one</li><li>two<li>three</ul>", ["Title.", "Text", "one.", "two.", "three."]),
        ("Intro<h3>Plan</h3><ol><li>Wake<li>Eat</ol>Done", ["Intro", "Plan.", "Wake.", "Eat.", "Done"]),
        ("| Room | Devices |\n|---|---|\n| Hall | Lamp<br>Fan |", ["Room, Devices.", "Hall, Lamp, Fan."]),
        ("<table><tr><th>Room</th><th>Temp</th></tr>\n<tr><td>Hall</td>\n<td>19 °C</td></tr></table>", ["Room, Temp.", "Hall, 19 °C."]),
        ("<details><summary>Thought for 3 seconds</summary>\nSome notes.\n</details>\nIt is 4.", ["Thought for 3 seconds.", "Some notes.", "It is 4."]),
        ("<think>\nThe user wants 2+2.\n\n- easy\n</think>\n\nIt is 4.", ["It is 4."]),
        ("Hi.\n<!--\n- hidden item\n```\n-->\nBye.", ["Hi.", "Bye."]),
        ("<script>\nlet a = 1;\n</script>Shown.", ["Shown."]),
        ("Use <style> tags for CSS. And more.", ["Use"]),  # an unclosed <style> hides the rest, as in a browser
        ("Roses are red<br / >Violets are blue<br\n/>Sugar", ["Roses are red", "Violets are blue", "Sugar"]),
        ("Sure.<think>plan</think>Okay! <!-- note -->Done", ["Sure.", "Okay!", "Done"]),
        ("Dr.<think>plan</think> Smith", ["Dr.", "Smith"]),  # a finished sentence ends at an unspoken block
        ("greet them</think>Hello there. How are you?", ["greet them", "Hello there.", "How are you?"]),  # thoughts opened in the prompt
        ("See <think>plan</think>the <!-- note -->docs", ["See the docs"]),  # an unfinished one goes on
        ("Hi<br", ["Hi"]),
    ],
)
def test_markup_breaks_phrases_and_hides_what_a_browser_hides(text: str, expected: list[str]) -> None:
    for deltas in splits(text):
        assert segments(*deltas) == expected, deltas


#: Marked-up LLM replies and prose with angle brackets, for the split-everywhere test below.
MARKED_UP = [
    '<speak>Hello <break time="1s"/> there.</speak> <p>Fish &amp; chips&nbsp;<b>now</b>!</p><ul><li>one</li>'
    "<li>two<br>three</li></ul><!-- a\nb --><script>x()</script> <sub alias=\"World Wide Web\">WWW</sub> "
    "<think>no</think>Mail <a@b.io> at https://www.x.org/a?b=1&amp;c=2 or <a href='https://y.io'>y</a>.\n"
    "| A | B<br>C &#8364; |\n|---|---|\n| 1 | <i>2</i> |\n",
    "If a < b and c > d, then x<5 and I <3 it -> done. Vec<T> is <A>; a<b and c>d. AT&T &copy 2024, Q&A <- ok",
    'Sure. <think>\nThe user <b>asks</b>.\n</think><a\nhref="https://x.io"\n  title=\'a\nb\'>Link</a> <br / >Fish&#0;&#x81; '
    "chips&#xD800;!<img\nalt='A car'\n/> ok.<!-- a --> Dr.<script\n>x</script\n>Bye<br/ >no</b\n>\n- item</spe",
    "If a<b\nand c>d then x <b\n\nclass='y'> a </ b\n- x<b and c\nVec<T\nor a<b",
    # run-on text (over a segment without a sentence end) between control characters
    "Sure\x00 so\x81 we \ufeffwent\ufffd on\x0bwith " + "the long walk down to the old mill by the river " * 5
    + "and Dr. Who came <b>too</b>, then " + "我们今天去公园玩然后回家吃饭" * 7 + " ok\x85done",
]


@pytest.mark.parametrize(
    "text", MARKED_UP, ids=["markup", "prose", "markup-over-lines", "prose-over-lines", "run-on-controls"]
)
def test_markup_split_at_every_character_reads_as_the_whole_text(text: str) -> None:
    whole = segments(text)
    assert whole and clean_text(text)
    for cut in range(1, len(text)):
        assert segments(text[:cut], text[cut:]) == whole, cut
    for deltas in splits(text)[1:]:
        assert segments(*deltas) == whole, deltas
        assert segments(*deltas, streamed=True) != [] and re.findall(r"\w", "".join(segments(*deltas, streamed=True))) == re.findall(r"\w", "".join(whole))
        reader, emitted = MarkdownReader(), ""
        for delta in deltas:
            emitted += reader.feed(delta)
            if text in (MARKED_UP[0], MARKED_UP[2]):  # no angle bracket or entity of it is ever spoken
                assert not re.search(r"[<>]|&\w", emitted), emitted
        assert " ".join((emitted + reader.close()).split()) == clean_text(text)


def test_markup_segments_of_the_first_reply() -> None:
    assert segments(MARKED_UP[0]) == [
        "Hello", "there.", "Fish & chips now!", "one.", "two", "three.", "World Wide Web Mail a@b.io at x.org or y.",
        "A, B, C €.", "1, 2.",
    ]
    assert clean_text(MARKED_UP[1]) == MARKED_UP[1].replace("&copy", "©")
    assert segments(MARKED_UP[2]) == ["Sure.", "Link", "Fish chips!", "A car ok.", "Dr.", "Bye", "no", "item."]
    assert segments(MARKED_UP[3]) == ["If a<b and c>d then x <b", "class='y'> a </ b", "x<b and c.", "Vec<T or a<b"]
    walk, cjk = "the long walk down to the old mill by the river ", "我们今天去公园玩然后回家吃饭"
    assert segments(MARKED_UP[4]) == [  # run-on: at a comma, between CJK characters, a long word at a character
        f"Sure so we went on with {walk * 5}and Dr. Who came too,", "then " + (cjk * 7)[:86], (cjk * 7)[86:] + " ok done",
    ]


def test_markup_deltas_that_end_next_to_a_url() -> None:
    """An entity just before a URL still being written is decoded, and a URL glued to the
    word of the delta before is no URL, as in the whole text."""
    assert segments("Now 5&#8364;https://www.a.i", "o/x ok") == segments("Now 5&#8364;https://www.a.io/x ok") == ["Now 5€a.io ok"]
    assert segments("22.5", "www.b.io&amp;x~~y~~ ok") == segments("22.5www.b.io&amp;x~~y~~ ok") == ["22.5www.b.io&xy ok"]


def test_a_sentence_before_an_unspoken_block_is_spoken_at_once() -> None:
    """A reasoning model's ``<think>`` (or a ``<script>``, ``<style>`` or comment) after a
    finished sentence does not hold that sentence back until the block ends; an unfinished
    one still waits for its end, and the speech is the whole text's."""
    for streamed in (False, True):
        segmenter = Segmenter(streamed=streamed)
        assert segmenter.add("Let me check. <thi") == []
        assert segmenter.add("nk>") == ["Let me check."]  # the block may go on for minutes
        assert segmenter.add("\nThe user asks.\n\n- lights\n</think>\n\nThe lights") == []
        assert segmenter.add(" are on. Anything") == ["The lights are on."]
        assert segmenter.finish() == ["Anything"]
    segmenter = Segmenter(streamed=True)
    assert segmenter.add("Sure? <!--") == ["Sure?"]
    assert segmenter.add(" note --> I <script>") == []  # "I" is no finished sentence
    assert segmenter.add("x()</script> did.") == []
    assert segmenter.finish() == ["I did."]
    assert segments("Let me check. <think>\nhmm\n</think>\n\nThe lights are on.") == ["Let me check.", "The lights are on."]


def test_a_tag_over_lines_is_held_until_it_is_decided() -> None:
    """A tag whose name ends a line may go on over the next: the reader holds it, and only it,
    until it ends or cannot be a tag."""
    reader = MarkdownReader()
    assert reader.feed("Here is a <a") == "Here is a "
    assert reader.feed("\n") == ""
    assert reader.feed('href="https://x.io"\n') == ""
    assert reader.feed(">link</a> ok") == "link ok"
    reader = MarkdownReader()
    assert reader.feed("if a<b\nand") == "if a"
    assert reader.feed(" c, d") == "<b and c, d"  # a comma is in no attribute: prose
    assert reader.feed("\nRoses<br") == " Roses"
    assert reader.close().isspace()  # a known tag begun at the very end is dropped


def test_awkward_delta_splits() -> None:
    assert segments("**Su", "re!*", "* Here it is.") == ["Sure!", "Here it is."]
    assert segments("It is 22", ".", "5 degrees. Nice.") == ["It is 22.5 degrees.", "Nice."]
    assert segments("See https://exa", "mple.com/pa", "th?q=1 for more.") == ["See example.com for more."]
    assert segments("Hel", "lo wor", "ld. How", " are y", "ou? Fi", "ne") == ["Hello world.", "How are you?", "Fine"]
    assert segments("- fir", "st\n-", " second") == ["first.", "second."]


def test_a_sentence_is_released_as_soon_as_a_rule_or_the_next_sentence_makes_it_certain() -> None:
    segmenter = Segmenter()
    assert segmenter.add("First sentence.") == []  # could still be an abbreviation or "..."
    assert segmenter.add(" Second") == ["First sentence."]
    assert segmenter.add(" one TTS.") == []
    assert segmenter.add(" This") == ["Second one TTS."]
    assert segmenter.add(" list:\n- a") == ["This list:"]
    assert segmenter.add("pples\n") == ["apples."]  # a list item ends at its newline


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Sure, I turned on the hallway lights. Anything else?", ["Sure,", "I turned on the hallway lights.", "Anything else?"]),
        ("The forecast for today: sunny, then rain. Later, wind.", ["The forecast for today:", "sunny, then rain.", "Later, wind."]),
        ("It is sunny - perfect for a walk.", ["It is sunny -", "perfect for a walk."]),
        ("Sure—here it is.", ["Sure—", "here it is."]),
        ("It is 1,000 km (about 600 mi, roughly) away.", ["It is 1,000 km (about 600 mi, roughly) away."]),
        ("Done. Then, later, more.", ["Done.", "Then, later, more."]),  # only the first sentence
        ("好的，我已经打开了灯。还有别的吗？", ["好的，", "我已经打开了灯。", "还有别的吗？"]),
        ("Rating: *", ["Rating: *"]),  # no segment of a lone symbol, which has nothing to say
        ("好的，*", ["好的，*"]),
        ("Note: ** and *x*", ["Note:", "** and x"]),
        ("はい、電気をつけました。", ["はい、", "電気をつけました。"]),
        ("Gerne, ich habe das Licht eingeschaltet.", ["Gerne,", "ich habe das Licht eingeschaltet."]),
        ("D'accord : la lumière est allumée.", ["D'accord:", "la lumière est allumée."]),
        ("# Lights\nOn, all of them.", ["Lights.", "On, all of them."]),  # a heading came first
    ],
)
def test_streamed_text_may_start_with_a_clause(text: str, expected: list[str]) -> None:
    for deltas in splits(text):
        assert segments(*deltas, streamed=True) == expected, deltas


def test_whole_text_keeps_sentences_and_streamed_clause_needs_no_sentence_end() -> None:
    assert segments("Sure, I turned on the lights. Bye.") == ["Sure, I turned on the lights.", "Bye."]
    segmenter = Segmenter(streamed=True)
    assert segmenter.add("Sure, I") == ["Sure,"]  # spoken before the sentence is complete
    assert segmenter.add(" turned on the lights, the fan") == []  # later clauses wait for the sentence
    assert segmenter.finish() == ["I turned on the lights, the fan"]


@pytest.mark.parametrize("text", ["word " * 600, "字" * 400, "a" * 2000, ("clause, " * 300), "字" * 42 + "x" * 200])
def test_long_text_is_split_without_loss_and_fits_the_cache(text: str) -> None:
    pieces = split_long(text.strip())
    assert len(pieces) > 1
    assert all(p and estimated_seconds(p) <= MAX_SEGMENT_SECONDS for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    # Generation cap + a generous prompt stays inside faster-qwen3-tts's 2048-token KV cache.
    assert all(frame_budget(p) + 600 < 2048 for p in pieces)


def test_a_long_sentence_is_cut_between_words_and_never_changed() -> None:
    """A sentence over a segment is cut where run-on text is (its last clause mark that fits,
    else a word boundary): "1,000" and "12:30" stay whole, no space is added."""
    text = "It is 1,000 km and 12:30 now " + "word " * 70 + "done."
    assert split_long(text) == [text[:298], text[299:]]
    assert segments(text) == split_long(text)
    chinese = "好的，" + "我们今天去公园玩然后回家吃饭" * 7 + "。"
    assert split_long(chinese) == ["好的，", chinese[3:90], chinese[90:]]
    listed = "- Yes, " + "word " * 58 + "x" * 25 + "\n- b"  # (over a segment inside its last word)
    for cut in range(1, len(listed)):
        assert segments(listed[:cut], listed[cut:]) == segments(listed) == ["Yes,", "word " * 57 + "word", "x" * 25 + ".", "b."]


def test_emoji_only_sentences_are_dropped() -> None:
    assert segments("Hi there! 🎉🎉 Bye.") == ["Hi there!", "Bye."]
    assert segments("🎉🎉") == []
    assert segments("- 🎉\n- ok") == ["ok."]


def test_frame_budget_grows_with_text_and_is_bounded() -> None:
    assert frame_budget("Hi.") < frame_budget("Hello there, how are you doing today?")
    assert frame_budget("字" * 10) > frame_budget("a" * 10)  # CJK characters take longer to say
    assert frame_budget("Hi.") >= 13  # at least a second of audio


def run_on(chars: int, seed: int = 0, comma_every: int = 0) -> str:
    """Random lowercase words without any sentence end (and commas only every
    ``comma_every`` words): an LLM reply without full stops, a list of words."""
    rng = random.Random(seed)
    words: list[str] = []
    while sum(map(len, words)) + len(words) < chars:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 9)))
        words.append(word + ("," if comma_every and len(words) % comma_every == comma_every - 1 else ""))
    return " ".join(words)


class CountingDetector(SentenceBoundaryDetector):
    """sentence-stream's detector, counting the characters it searches (its whole buffer at
    every chunk) and the most it ever held."""

    searched = 0
    most = 0

    def add_chunk(self, chunk: str) -> Iterable[str]:
        held = len(self.current_sentence + self.remaining_text + chunk)
        CountingDetector.searched += held
        CountingDetector.most = max(CountingDetector.most, held)
        return super().add_chunk(chunk)


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(
    "kind",
    ["words", "cjk", "long-word", "symbols"],
    ids=["words", "chinese-without-punctuation", "one-long-word", "nothing-speakable"],
)
def test_work_per_delta_is_bounded_on_text_without_sentence_ends(
    streamed: bool, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run-on text fed 7 characters at a time: the segmenter's text and sentence-stream's
    buffer stay within a segment and a little, and the characters sentence-stream searches
    grow with the text, not with its square (this was 0.6 s for 10 KB and 5 s for 40 KB)."""
    monkeypatch.setattr(text_module, "SentenceBoundaryDetector", CountingDetector)
    searched: list[int] = []
    for chars in (8_000, 16_000):
        text = {
            "words": run_on(chars),
            "cjk": ("我们今天去公园玩然后回家吃饭" * chars)[: chars // 3],
            "long-word": "x" * chars,
            "symbols": "% " * (chars // 2),  # (no segment: the first clause may still come)
        }[kind]
        CountingDetector.searched = CountingDetector.most = 0
        segmenter = Segmenter(streamed=streamed)
        for start in range(0, len(text), 7):
            segmenter.add(text[start : start + 7])
            assert len(segmenter._text) < 1000, start  # (context and the part not fed yet)
            assert CountingDetector.most < 1000, start
        segmenter.finish()
        searched.append(CountingDetector.searched)
    assert searched[1] < 2.3 * searched[0], searched  # linear: twice the text, twice the work


def test_run_on_streamed_text_is_spoken_as_it_streams() -> None:
    """An LLM reply without sentence ends is released a segment at a time while it streams,
    at word boundaries, never more than a segment and a little behind what has come; the
    same segments as the whole text."""
    text = run_on(10_000, seed=1)
    segmenter, released, fed = Segmenter(streamed=True), [], 0
    for start in range(0, len(text), 7):
        released += segmenter.add(text[start : start + 7])
        fed = start + 7
        assert fed - sum(len(s) + 1 for s in released) < 400, fed  # (a segment is ~300 characters)
    assert len(released) >= 30
    assert released + segmenter.finish() == segments(text) == segments(*re.findall(".{1,7}", text, re.S))
    assert " ".join(segments(text)) == text  # cut only between words
    assert all(estimated_seconds(s) <= MAX_SEGMENT_SECONDS < estimated_seconds(s) + 1 for s in segments(text)[:-1])


def test_run_on_text_is_cut_at_its_last_clause_mark() -> None:
    """Run-on text with commas is released at the last comma that fits; "." that ends no
    sentence (a lowercase word follows) is a mark too, a title's "." ("Dr.") is not."""
    text = run_on(3_000, seed=2, comma_every=13)
    segmenter = Segmenter(streamed=True)
    released = [p for delta in re.findall(".{1,5}", text, re.S) for p in segmenter.add(delta)]
    assert len(released) > 8 and all(p.endswith(",") for p in released), released
    assert released + segmenter.finish() == segments(text, streamed=True)  # (the first ends at a clause)
    assert " ".join(segments(text)) == text
    assert run_on_cut("so it goes. " + "word " * 70) == len("so it goes.")
    assert run_on_cut("so it goes and " + "word " * 20 + "with Dr. Smith " + "word " * 60) == 300  # at a space
    assert run_on_cut("word " * 100) == 300  # (60 words of 4 letters and the spaces between them)
    assert run_on_cut("x" * 500) == 300
    assert run_on_cut("好" * 10 + "x" * 400) == 10  # between a CJK character and a word
    assert run_on_cut("short, enough") == len("short, enough")


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("a\x00b\x01c\x08d\x1ae\x7ff", "abcdef"),  # C0 controls and DEL (ESC: below)
        ("a\x80b\x81c\x9fd", "abcd"),  # C1 controls
        ("a\ufffdb\ufeffc", "abc"),  # the replacement character, a byte order mark
        ("a\ud800b\udfffc", "abc"),  # lone surrogates (as JSON's "\ud800" decodes)
        ("a\ufffeb\uffffc\ufdd0d\U0001fffee\U0010ffff", "abcde"),  # non-characters
        ("a\xadb\u200bc\u2060d", "abcd"),  # soft hyphen, zero-width space, word joiner
        ("a\x0bb\x0cc\x1cd\x1fe\x85f", "a b c d e f"),  # whitespace controls: spaces
        ("\ufeff- one\x00\n- two\r\n\tthree\n", "one. two. three"),  # tab, newline and CR still work
        ("&#x81;&#65533;&#xFEFF;ok", "ok"),  # the same as entities
    ],
)
def test_characters_that_are_no_text_are_never_spoken(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean
    for deltas in splits(raw):
        assert " ".join(segments(*deltas)) == clean, deltas
        assert " ".join(segments(*deltas, streamed=True)) == clean, deltas


def every_split(text: str) -> list[list[str]]:
    """``splits(text)`` and the text cut in two at every character."""
    return splits(text) + [[text[:cut], text[cut:]] for cut in range(1, len(text))]


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("\x1b[31mred\x1b[0m alert", "red alert"),  # colours (SGR)
        ("\x1b[1;38;5;208mOrange\x1b[0m, \x1b[?25lcursor\x1b[2K off\x1b[38:2::255:0:0m", "Orange, cursor off"),
        ("\x1b]0;build log\x07Done", "Done"),  # OSC (a window title), ended by BEL
        ("See \x1b]8;;https://x.io/a\x1b\\the docs\x1b]8;;\x1b\\ now", "See the docs now"),  # OSC 8 link, ST
        ("\x9b32mgreen\x9b0m ok", "green ok"),  # 8-bit CSI
        ("\x1b(B\x1b[mplain \x1b7saved\x1b8", "plain saved"),  # tput sgr0's charset, cursor save/restore
        ("\x1b[1m**Sure!**\x1b[0m Here:\n- \x1b[32mone\x1b[0m", "Sure! Here: one."),  # markdown inside
        ("Done.\x1b[3", "Done."),  # cut off by the end of the text
        ("Done.\x1b]0;tit", "Done."),
        ("Done.\x1b", "Done."),
        ("Bare ESC \x1b alone stays?", "Bare ESC alone stays?"),  # a stray ESC, then a word
        ("Bare\x1b  alone \x1b\x1b two", "Bare alone two"),
        ("\x1b(0x\x1b(B ok \x1b#8 done", "x ok done"),  # nF sequences still go whole
    ],
)
def test_terminal_escape_sequences_are_never_spoken(raw: str, clean: str) -> None:
    """Colour codes and other ECMA-48 escape sequences from a tool's or an LLM's output are
    dropped whole (only their ESC was, and "[31m" was spoken), however the deltas cut them."""
    assert clean_text(raw) == clean
    for deltas in every_split(raw):
        assert " ".join(segments(*deltas)) == clean, deltas
        assert " ".join(segments(*deltas, streamed=True)) == clean, deltas


def test_an_escape_sequence_that_never_ends_is_held_back_only_so_far() -> None:
    """A control string with no end (an OSC cut off, or ESC "]" in garbage) is held back
    while it may still end, up to ``MAX_ESCAPE_CHARS``; then only its ESC is dropped, as in
    the whole text, and the work per delta stays bounded."""
    raw = "Hi \x1b]" + "x" * 2000 + " there"
    reader, emitted = MarkdownReader(), ""
    for start in range(0, len(raw), 7):
        emitted += reader.feed(raw[start : start + 7])
        assert len(reader._escape) <= MAX_ESCAPE_CHARS + 9, start
    assert " ".join((emitted + reader.close()).split()) == clean_text(raw) == "Hi ]" + "x" * 2000 + " there"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Fish &amp chips &lt;3 &gt 2", "Fish & chips <3 > 2"),
        ("&#65&#x42 &#67x &#x44g &copy2024 &copy 2024 &frac12 &sup23", "AB Cx Dg ©2024 © 2024 ½ ²3"),
        ("AT&T, R&D, Q&A, S&P 500, M&Ms, BTC&ETH, &notebook, this&copyright", "AT&T, R&D, Q&A, S&P 500, M&Ms, BTC&ETH, &notebook, this&copyright"),
        ("caf&eacute au lait &amp", "café au lait &"),  # at the end of the text too
    ],
)
def test_character_references_without_semicolon_are_read_as_a_browser_does(raw: str, clean: str) -> None:
    """HTML5 decodes numeric references and its legacy names (``&amp``, ``&lt``, ``&copy``)
    without ';' (``html.unescape``); prose with "&" (AT&T, R&D) stays, as does a legacy name
    followed by a letter or written in capitals. The same however the deltas cut them."""
    assert clean_text(raw) == clean
    for deltas in every_split(raw):
        assert " ".join(segments(*deltas)) == clean, deltas
        assert " ".join(segments(*deltas, streamed=True)) == clean, deltas


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("5 * 3 * 4 is sixty. Yes.", ["5 × 3 × 4 is sixty.", "Yes."]),
        ("It is 2*3*4. *Really*, **yes**.", ["It is 2×3×4.", "Really, yes."]),
        ("Take x * y and 2 ** 8.\n* 7 * 6 = 42", ["Take x * y and 2 ** 8.", "7 × 6 = 42."]),
        ("*Note:* a * b", ["Note: a * b"]),
        ("-5 * -3 and $5 * 3, -5*-3 or 2*$3.", ["-5 × -3 and $5 × 3, -5×-3 or 2×$3."]),  # signed, amounts
    ],
)
def test_products_say_their_operator_and_emphasis_does_not(raw: str, expected: list[str]) -> None:
    """sentence-stream drops the asterisks around a word ("5 * 3 * 4" came out "5 3 4"), and
    the reader took "2*3" for emphasis ("23"): a product between numbers is spoken with "×",
    another spaced "*" reaches the model, emphasis markers do not; whole and streamed."""
    assert clean_text(raw) == " ".join(expected)
    for deltas in every_split(raw):
        assert segments(*deltas) == expected, deltas
        assert " ".join(segments(*deltas, streamed=True)) == " ".join(expected), deltas


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Rated 5* by users", "Rated 5* by users"),  # a "*" that can only close, and nothing open
        ("Rated 5*", "Rated 5*"),
        ("**Rated 5* by users**", "Rated 5 by users*"),  # CommonMark: the "*" closes one of the "**"
        ("A*B and a*b", "AB and ab"),  # CommonMark: "A", italic "B and a", "b"
        ("***a** b*, *a **b***", "a b, a b"),
        ("*Note:* 4.5* stars", "Note: 4.5* stars"),
        # a "*" run that opens and that nothing closes on its line
        ("Rating: *", "Rating: *"),
        ("a *b", "a *b"),
        ("*a", "*a"),
        ("**a and a **b", "**a and a **b"),
        ("a* b, 5 * 3, 2*3, a ** b", "a* b, 5 × 3, 2×3, a ** b"),
        ("*a **b*", "*a *b"),  # CommonMark: the "*" closes the innermost run, one of the "**"
        ("*a b**c d*", "a b**c d"),  # the run inside the one closed (and passed over) is text
        ("***a**", "*a"),  # the star of three that no closer took
        ("A*B", "A*B"),
        ("x *y z\nnext *w*", "x *y z next w"),  # not closed over a line break
        ("- *item\n- **bold**", "*item. bold."),
        ("*Note: a *b*", "*Note: a b"),
        # unbalanced runs: the stars neither run pairs off are text, on their side (CommonMark)
        ("**a*", "*a"),  # "*" + italic "a"
        ("*a**", "a*"),  # italic "a" + "*"
        ("**a", "**a"),
        ("a**b*", "a**b*"),  # rule of 3: "**" may open and close, and 2 + 1 is 3
        ("*a***", "a**"),
        ("**a*** b", "a* b"),
        ("x **a* y", "x *a y"),
        ("**a*b", "**a*b"),
    ],
)
def test_a_star_run_that_is_no_emphasis_is_kept(raw: str, clean: str) -> None:
    """A "*" after a word with none open before it on its line is no emphasis (CommonMark's
    reading); every "*" that followed a word was dropped, so "Rated 5* by users" lost its
    star. So is one that opens and is never closed on its line: it was dropped at once, so
    "a *b" was read "a b". Whole and streamed, cut anywhere."""
    assert clean_text(raw) == clean
    for deltas in every_split(raw):
        assert " ".join(segments(*deltas)) == clean, deltas
        assert " ".join(segments(*deltas, streamed=True)) == clean, deltas


def read(*deltas: str) -> list[str]:
    """What a ``MarkdownReader`` has returned after each delta, and after ``close``, spaces tidied."""
    reader, emitted, out = MarkdownReader(), "", []
    for delta in [*deltas, None]:
        emitted += reader.feed(delta) if delta is not None else reader.close()
        out.append(" ".join(emitted.split()))
    return out


@pytest.mark.parametrize(("raw", "clean"), [("**", "**"), ("Rating: *", "Rating: *"), ("a *b", "a *b")])
def test_a_star_run_with_nothing_speakable_is_kept_by_the_reader(raw: str, clean: str) -> None:
    """The reader keeps the stars of a run that is no emphasis however the text is cut
    (``clean_text`` then drops a text with no word to say, "**" alone)."""
    for deltas in every_split(raw):
        assert read(*deltas)[-1] == clean, deltas


def test_only_the_text_after_an_open_star_run_waits_for_its_closer() -> None:
    """Text before a "*" that opens is released at once, the text after it once its closer
    comes (emphasis, markers dropped) or its line ends (text, its star kept), or after
    ``MAX_EMPHASIS_CHARS`` without a closer; a "*" that cannot open holds nothing back."""
    assert read("Sure. *Really ", "sure") == ["Sure.", "Sure.", "Sure. *Really sure"]  # (never closed)
    assert read("Sure. *Really ", "sure* it is")[1] == "Sure. Really sure it is"
    assert read("a *b c\n", "d")[0] == "a *b c"
    assert read("5 * 3 is ", "x")[0] == "5 * 3 is"
    assert read("Rated 5* by ", "x")[0] == "Rated 5* by"
    words = "word " * (MAX_EMPHASIS_CHARS // 5)  # (a closer after them comes too late)
    late = f"a *b {words}c* d"
    assert read(late[:300], late[300:]) == ["a", f"a *b {words}c* d", f"a *b {words}c* d"]  # not to the line end
    in_time = f"a *b {words[5:]}c* d"
    assert read(in_time[:300], in_time[300:]) == ["a", f"a b {words[5:]}c d", f"a b {words[5:]}c d"]
    for deltas in splits(late) + splits(in_time):
        assert read(*deltas)[-1] == read("".join(deltas))[-1], deltas


#: Pieces of LLM-style markdown in several scripts, for random texts below.
_PIECES = [
    "\n- ", "\n1. ", "\n# ", "\n| a | b |", "\n|---|---|", "\n```py\n", "\n```\n", "\n> ", "\n---\n",
    "**", "*", "_", "`", "~~", "[t](u)", "https://www.a.io/x ", "TTS. ", "Yes. ", "Dr. ", "snake_case",
    "5 * 3", "22.5", "1,000", ", ", ": ", " - ", "—", ". ", "! ", "? ", "。", "，", "、", "！", "¿", "¡",
    "«", "»", "\"", "(", ")", "🎉", "°", "%", "€", "Hello", "world", "好的", "はい", "한국", "да", " ",
]


#: Pieces of HTML and SSML markup, and prose that only looks like it, for random texts below.
_MARKUP_PIECES = [
    "<b>", "</b>", "<br>", "<br/>", "<p>", "</p>", "<li>", "</li>", "<td>", '<break time="1s"/>', "<speak>",
    '<say-as interpret-as="characters">', "</say-as>", "&amp;", "&nbsp;", "&#8364;", "&bogus;", "AT&T", "<",
    ">", "&", "<!--", "-->", "<script>", "</script>", '<sub alias="W">', "</sub>", "<a@b.io>", "x<3", "<T>",
    '<a href="https://x.io/?a=1&amp;b">', "</a>",
    # tags over lines, self-closing forms, references to no character, tags cut off at the end
    "<a\nhref='x'>", "<b\n", "\nclass=\"x\">", '<break\ntime="1s"\n/>', "<br / >", "<br/ >", "\n>", "&#0;", "&#xD800;",
    "&#x81;", "</b", "</spe", "<br", "<li", "a<b", "</", "<!-", "<?xml", "<think>", "</think>", "Done. ", "\n\n",
    # references without ';', terminal escape sequences, products
    "&amp", "&copy", "&#65", "&#x4", "&not", "\x1b[31m", "\x1b[0m", "\x1b]0;t", "\x07", "\x1b\\", "\x1b", "\x9b", "2*3",
]


#: Run-on text (no sentence end for over a segment), characters that are no text, and some
#: of the marks and markup above.
_RUN_ON_PIECES = [
    "the long walk down to the old mill by the river and on " * 3, "我们今天去公园玩然后回家吃饭" * 3, "x" * 120, "so. ",
    "Dr. ", ", ", "，", " - ", "\x00", "\x81", "\ufffd", "\ufeff", "\x0b", "\x85", "\ud800", "\xad", "\uffff",
    "\n- ", "**", "Hello ", "? ", "\n\n", "<b>", "&#0;", " ",
]


@pytest.mark.parametrize(
    "pieces", [_PIECES, _PIECES + _MARKUP_PIECES, _RUN_ON_PIECES], ids=["markdown", "markup", "run-on"]
)
def test_random_markdown_split_anywhere_reads_as_the_whole_text(pieces: list[str]) -> None:
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert segments(*deltas) == segments(text), deltas
        words = re.findall(r"\w", "".join(segments(text)))
        assert re.findall(r"\w", "".join(segments(*deltas, streamed=True))) == words, deltas  # only split
