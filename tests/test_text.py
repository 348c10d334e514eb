"""The text front end: markdown to speech, sentence segments of whole and streamed text, budgets."""

from __future__ import annotations

import random
import re

import pytest

from wyoming_qwen3tts.text import (
    MAX_SEGMENT_SECONDS,
    MarkdownReader,
    Segmenter,
    clean_text,
    estimated_seconds,
    frame_budget,
    split_long,
)


def segments(*deltas: str, streamed: bool = False) -> list[str]:
    segmenter = Segmenter(streamed=streamed)
    return [s for d in deltas for s in segmenter.add(d)] + segmenter.finish()


def splits(text: str) -> list[list[str]]:
    """The text as one delta, one character per delta, and deltas of random lengths."""
    rng = random.Random(text)
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
        ("a spaced asterisk is no markup", "5 * 3 = 15, *not* 16", "5 * 3 = 15, not 16"),
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


@pytest.mark.parametrize("text", ["word " * 600, "字" * 400, "a" * 2000, ("clause, " * 300)])
def test_long_text_is_split_without_loss_and_fits_the_cache(text: str) -> None:
    pieces = split_long(text.strip())
    assert len(pieces) > 1
    assert all(p and estimated_seconds(p) <= MAX_SEGMENT_SECONDS for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    # Generation cap + a generous prompt stays inside faster-qwen3-tts's 2048-token KV cache.
    assert all(frame_budget(p) + 600 < 2048 for p in pieces)


def test_emoji_only_sentences_are_dropped() -> None:
    assert segments("Hi there! 🎉🎉 Bye.") == ["Hi there!", "Bye."]
    assert segments("🎉🎉") == []
    assert segments("- 🎉\n- ok") == ["ok."]


def test_frame_budget_grows_with_text_and_is_bounded() -> None:
    assert frame_budget("Hi.") < frame_budget("Hello there, how are you doing today?")
    assert frame_budget("字" * 10) > frame_budget("a" * 10)  # CJK characters take longer to say
    assert frame_budget("Hi.") >= 13  # at least a second of audio


#: Pieces of LLM-style markdown in several scripts, for random texts below.
_PIECES = [
    "\n- ", "\n1. ", "\n# ", "\n| a | b |", "\n|---|---|", "\n```py\n", "\n```\n", "\n> ", "\n---\n",
    "**", "*", "_", "`", "~~", "[t](u)", "https://www.a.io/x ", "TTS. ", "Yes. ", "Dr. ", "snake_case",
    "5 * 3", "22.5", "1,000", ", ", ": ", " - ", "—", ". ", "! ", "? ", "。", "，", "、", "！", "¿", "¡",
    "«", "»", "\"", "(", ")", "🎉", "°", "%", "€", "Hello", "world", "好的", "はい", "한국", "да", " ",
]


def test_random_markdown_split_anywhere_reads_as_the_whole_text() -> None:
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 30)))
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert segments(*deltas) == segments(text), deltas
        words = re.findall(r"\w", "".join(segments(text)))
        assert re.findall(r"\w", "".join(segments(*deltas, streamed=True))) == words, deltas  # only split
