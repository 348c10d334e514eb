"""Text cleanup, sentence segmentation of streamed deltas, and frame budgets."""

import pytest

from wyoming_qwen3tts.text import MAX_SEGMENT_SECONDS, Segmenter, clean_text, estimated_seconds, frame_budget, split_long


def segments(*deltas: str) -> list[str]:
    segmenter = Segmenter()
    return [s for d in deltas for s in segmenter.add(d)] + segmenter.finish()


def test_deltas_split_inside_words_give_whole_sentences() -> None:
    assert segments("Hel", "lo wor", "ld. How", " are y", "ou? Fi", "ne") == ["Hello world.", "How are you?", "Fine"]


def test_decimal_numbers_are_not_sentence_ends() -> None:
    assert segments("It is 22", ".5 degrees. Nice.") == ["It is 22.5 degrees.", "Nice."]


def test_a_sentence_is_released_as_soon_as_the_next_begins() -> None:
    segmenter = Segmenter()
    assert segmenter.add("First sentence.") == []  # could still be an abbreviation or "..."
    assert segmenter.add(" Second") == ["First sentence."]


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("**Bold** and *italic* text", "Bold and italic text"),
        ("# Heading\n- item one\n- item two", "Heading item one item two"),
        ("See [the docs](https://example.com/x) now", "See the docs now"),
        ("Party time 🎉🎉!", "Party time!"),
        ("Use `code` here", "Use code here"),
        ("Visit https://example.com today", "Visit today"),
        ("🎉", ""),
        ("Temp 22.5°C 😀", "Temp 22.5°C"),
        ("Mail a_b@c.de", "Mail a_b@c.de"),
        ("Hi :-) ;)", "Hi :-) ;)"),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "a b 1 2"),
        ("🇩🇪 Berlin", "Berlin"),
    ],
)
def test_clean_text_drops_markup_and_emoji(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


def test_emoji_only_sentences_are_dropped() -> None:
    assert segments("Hi there! 🎉🎉 Bye.") == ["Hi there! Bye."]
    assert segments("🎉🎉") == []


@pytest.mark.parametrize("text", ["word " * 600, "字" * 400, "a" * 2000, ("clause, " * 300)])
def test_long_text_is_split_without_loss_and_fits_the_cache(text: str) -> None:
    pieces = split_long(text.strip())
    assert len(pieces) > 1
    assert all(p and estimated_seconds(p) <= MAX_SEGMENT_SECONDS for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    # Generation cap + a generous prompt stays inside faster-qwen3-tts's 2048-token KV cache.
    assert all(frame_budget(p) + 600 < 2048 for p in pieces)


def test_frame_budget_grows_with_text_and_is_bounded() -> None:
    assert frame_budget("Hi.") < frame_budget("Hello there, how are you doing today?")
    assert frame_budget("字" * 10) > frame_budget("a" * 10)  # CJK characters take longer to say
    assert frame_budget("Hi.") >= 13  # at least a second of audio
