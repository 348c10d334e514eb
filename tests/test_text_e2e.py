"""End to end: streamed LLM text speaks its first clause before its first sentence is complete;
the default models serve every pipeline language; ``--debug`` shows what is spoken. A real
server process on tiny checkpoints."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from wyoming_qwen3tts.doors.http import ws_events
from wyoming_qwen3tts.common.audio import SAMPLES_PER_FRAME
from wyoming_qwen3tts.text.languages import ALL_CODES
from wyoming_qwen3tts.text.segmenter import Segmenter

from .conftest import Server, start_server, stop_server

#: Slow: a real server process.
pytestmark = pytest.mark.full

#: A hang guard for reads, not a speed assertion.
_GUARD_S = 180.0
#: Codec frames the debug server generates per segment (the CPU reference engine may stop one
#: short): more than segments per request, so a segment lost or spoken twice shows in the total.
FRAMES = 6


@pytest.fixture(scope="module")
def debug_server(checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default model kinds (Base and VoiceDesign, tiny), an empty clone library, ``--debug``;
    every segment is ``FRAMES`` codec frames long, to keep the tests short."""
    folder = tmp_path_factory.mktemp("debug-server")
    (folder / "voices").mkdir()
    extra = ["--no-zeroconf", "--debug", "--custom-voice-model", "none", "--fixed-frames", str(FRAMES)]
    srv = start_server(checkpoints, folder / "voices", folder / "server.log", extra=extra)
    yield srv
    stop_server(srv)


async def read_until(client: AsyncTcpClient, stop_type: str) -> list[Event]:
    events: list[Event] = []
    while True:
        event = await asyncio.wait_for(client.read_event(), _GUARD_S)
        assert event is not None and not Error.is_type(event.type), (event, [e.type for e in events])
        events.append(event)
        if event.type == stop_type:
            return events


def spoken_segments(server: Server) -> list[tuple[str, str, str, int]]:
    """(text, language, voice, frame cap) of every segment the server logged at --debug."""
    pattern = r"segment \d+: '(.*)', language (\w+), voice (\w+), cap (\d+) frames$"
    return [(m[1], m[2], m[3], int(m[4])) for m in re.finditer(pattern, server.output(), re.M)]


async def test_first_audio_comes_before_the_first_sentence_is_complete(debug_server: Server) -> None:
    """Home Assistant streams an LLM reply: audio starts once the first clause is in, while the
    rest of the first sentence has not been sent yet (event order, not timing)."""
    head = ["**Su", "re**, I", " turn"]  # an early clause, the sentence goes on
    tail = ["ed on:\n- the hall", "way lights\n- the fan"]
    async with AsyncTcpClient("127.0.0.1", debug_server.port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="aria")).event())
        for delta in head:
            await client.write_event(SynthesizeChunk(text=delta).event())
        first = await read_until(client, "audio-chunk")  # would wait forever without the clause rule
        for delta in tail:
            await client.write_event(SynthesizeChunk(text=delta).event())
        await client.write_event(SynthesizeStop().event())
        events = first + await read_until(client, "synthesize-stopped")
    assert [e.type for e in first][-2:] == ["audio-start", "audio-chunk"]

    segmenter = Segmenter(streamed=True)
    expected = [s for d in head + tail for s in segmenter.add(d)] + segmenter.finish()
    assert expected == ["Sure,", "I turned on:", "the hallway lights.", "the fan."]
    assert spoken_segments(debug_server)[-4:] == [(s, "english", "aria", FRAMES) for s in expected]
    frames = sum(len(AudioChunk.from_event(e).audio) for e in events if AudioChunk.is_type(e.type))
    assert frames % (2 * SAMPLES_PER_FRAME) == 0  # each segment spoken once, none lost:
    assert (FRAMES - 1) * len(expected) <= frames // (2 * SAMPLES_PER_FRAME) <= FRAMES * len(expected)


async def test_whole_text_is_spoken_in_sentences_and_debug_logs_each_once(debug_server: Server) -> None:
    text = "Gerne, das Licht ist an. Fr. Schmidt ist da."
    async with AsyncTcpClient("127.0.0.1", debug_server.port) as client:
        await client.write_event(Event("synthesize", {"text": text, "voice": {"name": "lena"}}))
        await read_until(client, "audio-stop")
        await client.write_event(Synthesize(text="Okay.", voice=SynthesizeVoice(name="mei")).event())
        await read_until(client, "audio-stop")
    logged = spoken_segments(debug_server)[-3:]
    assert logged == [
        ("Gerne, das Licht ist an.", "german", "lena", FRAMES),
        ("Fr. Schmidt ist da.", "german", "lena", FRAMES),
        ("Okay.", "chinese", "mei", FRAMES),
    ]
    assert debug_server.output().count("'Fr. Schmidt ist da.'") == 1


async def test_default_models_offer_voices_for_every_pipeline_language(debug_server: Server) -> None:
    async with AsyncTcpClient("127.0.0.1", debug_server.port) as client:
        await client.write_event(Describe().event())
        info = Info.from_event((await read_until(client, "info"))[-1])
    (program,) = info.tts
    assert program.description == "Qwen3-TTS on qwen_tts reference model (CPU)"  # the real back end
    for code in ALL_CODES:  # Home Assistant offers a pipeline language the voices that list it
        assert [v.name for v in program.voices if code in v.languages], code


def test_debug_log_keeps_dependency_output(debug_server: Server) -> None:
    """``--debug`` hides nothing; the default level's quiet log is checked in test_readme.py."""
    assert all(noise in debug_server.output() for noise in ("flash-attn", "Loading weights"))


async def test_debug_log_keeps_our_lines_without_default_config_notes(debug_server: Server) -> None:
    """``--debug`` shows each segment; qwen_tts's "... is None. Initializing ... with default
    values" lines, one or more a sentence on the CPU, are not there to bury them."""
    async with AsyncTcpClient("127.0.0.1", debug_server.port) as client:
        await client.write_event(Synthesize(text="One sentence. And another one.").event())
        await read_until(client, "audio-stop")
    log = debug_server.output()
    assert spoken_segments(debug_server)[-2:] == [
        ("One sentence.", "english", "aria", FRAMES), ("And another one.", "english", "aria", FRAMES)
    ]
    assert "with default values" not in log, [line for line in log.splitlines() if "default values" in line][:3]


async def test_streamed_ssml_and_html_are_spoken_without_their_tags(debug_server: Server) -> None:
    """Home Assistant users send SSML and LLM replies carry HTML, streamed in deltas split inside
    tags and entities: the server speaks the words, never the markup, and ``<br>`` and
    ``<break>`` end a segment."""
    deltas = ['<speak>Sure, <b', 'r>the lights are <emphasis>o', 'n</emphasis> &am',
              'p; the fan<break time="1', 's"/> is off.</spe', 'ak>']
    async with AsyncTcpClient("127.0.0.1", debug_server.port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="aria")).event())
        for delta in deltas:
            await client.write_event(SynthesizeChunk(text=delta).event())
        await client.write_event(SynthesizeStop().event())
        await read_until(client, "synthesize-stopped")
    expected = ["Sure,", "the lights are on & the fan", "is off."]
    assert spoken_segments(debug_server)[-3:] == [(s, "english", "aria", FRAMES) for s in expected]


async def test_a_sentence_before_a_think_block_is_spoken_while_the_thoughts_stream(debug_server: Server) -> None:
    """A reasoning model's reply streamed over Wyoming: a first sentence, then its thoughts.
    The sentence is spoken as soon as the ``<think>`` opens, while the thoughts are still
    being written (event order, not timing); the rest is the whole text's speech. A text of
    markup alone gets audio-start and audio-stop and no audio, as any text with nothing to say."""
    head = ["Let me check", ". <thi", "nk>The user asks about", " the lights"]  # no line end yet
    tail = [".\n</think>\n\nThe lights", " are on."]
    async with AsyncTcpClient("127.0.0.1", debug_server.port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="aria")).event())
        for delta in head:
            await client.write_event(SynthesizeChunk(text=delta).event())
        first = await read_until(client, "audio-chunk")  # would wait for "</think>" without the rule
        for delta in tail:
            await client.write_event(SynthesizeChunk(text=delta).event())
        await client.write_event(SynthesizeStop().event())
        await read_until(client, "synthesize-stopped")
        await client.write_event(Synthesize(text='<speak><break time="1s"/><think>Hm.</think></speak>').event())
        empty = await read_until(client, "audio-stop")
    assert [e.type for e in first][-2:] == ["audio-start", "audio-chunk"]
    expected = ["Let me check.", "The lights are on."]
    segmenter = Segmenter(streamed=True)
    assert segmenter.add("".join(head + tail)) + segmenter.finish() == expected  # the whole text's speech
    assert spoken_segments(debug_server)[-2:] == [(s, "english", "aria", FRAMES) for s in expected]
    assert [e.type for e in empty] == ["audio-start", "audio-stop"]


#: Text with a lone surrogate, as JSON's "\ud800" decodes: a browser's ``JSON.stringify`` sends
#: one escaped so (the ``openai`` SDK and the ``wyoming`` package refuse to encode it).
LONE_SURROGATE_TEXT = "Lone \ud800surrogate, gone \udfffnow."


async def _speak_on(door: str, server: Server, text: str) -> list[str]:
    """Speak ``text`` (voice aria) through one door; the types of what came back, errors
    included (a refusal ends the exchange)."""
    escaped = json.dumps(text)  # ASCII: the surrogate as "\ud800", as JSON.stringify writes it
    if door == "wyoming":  # the wyoming package writes UTF-8 only: the event line by hand
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(f'{{"type": "synthesize", "data": {{"text": {escaped}, "voice": {{"name": "aria"}}}}}}\n'.encode())
        types: list[str] = []
        while not types or types[-1] not in ("audio-stop", "error"):
            event = await asyncio.wait_for(async_read_event(reader), _GUARD_S)
            assert event is not None, types
            types.append(event.type)
        writer.close()
        return types
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_GUARD_S)) as http:
        if door == "http":
            body = {"model": "tts-1", "input": text, "voice": "aria", "response_format": "pcm"}
            async with http.post(f"{server.http_url}/v1/audio/speech", json=body) as response:
                data = await response.read()
                return ["audio"] if response.status == 200 and data else [str(response.status), data.decode()]
        async with http.ws_connect(f"{server.http_url}{ws_events.PATH}", protocols=(ws_events.PROTOCOL,)) as ws:
            await ws.send_json({"type": "request.start", "voice": "aria", "response_format": "pcm"})
            await ws.send_str(f'{{"type": "input_text.append", "sequence": 0, "text": {escaped}}}')
            await ws.send_json({"type": "input_text.end", "sequence": 1})
            types = []
            async for message in ws:
                types.append(json.loads(message.data)["type"] if message.type is aiohttp.WSMsgType.TEXT else "audio")
                if types[-1] in ("response.done", "error"):
                    return types
            return types


@pytest.mark.parametrize("door", ["wyoming", "http", "websocket"])
async def test_a_lone_surrogate_is_dropped_and_the_rest_spoken_on_every_door(debug_server: Server, door: str) -> None:
    """JSON's "\\ud800" in the text decodes to a lone surrogate, no text: every door drops it
    as it drops other characters that are no text and speaks the rest (the HTTP door
    answered 400 invalid-json, the Wyoming door an error malformed-event)."""
    types = await _speak_on(door, debug_server, LONE_SURROGATE_TEXT)
    assert "error" not in types and ("audio" in types or "audio-chunk" in types), types
    segmenter = Segmenter(streamed=door == "websocket")  # (its text is streamed: a first clause)
    expected = segmenter.add(LONE_SURROGATE_TEXT) + segmenter.finish()
    assert " ".join(expected) == "Lone surrogate, gone now."
    assert spoken_segments(debug_server)[-len(expected) :] == [(s, "english", "aria", FRAMES) for s in expected]
    assert "Logging error" not in debug_server.output() and "UnicodeEncodeError" not in debug_server.output()
