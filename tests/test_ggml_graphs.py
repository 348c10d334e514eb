"""Our own generation graphs on the ggml that the qwentts.cpp wheel bundles
(``engine.cpu.native``): the ctypes declarations checked at load, and greedy codes equal to
the float32 lean modules (``testing.lean``) for every voice kind on the ``--size ggml``
checkpoints."""

from __future__ import annotations

import ctypes.util
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wyoming_qwen3tts.engine import Sampling, Segment
from wyoming_qwen3tts.engine.cpu.native import api
from wyoming_qwen3tts.engine.cpu.native.generator import GgmlFrameSource
from wyoming_qwen3tts.common.vocabulary import ModelKind, Reference

from .conftest import CHECKPOINTS, CLONE_TRANSCRIPT


def _wheel_or_skip() -> api.Ggml:
    try:
        return api.load()
    except api.GgmlApiError as err:
        pytest.skip(f"the wheel's ggml is not usable here: {err}")


# --- the declarations, checked at load -------------------------------------------------------


def test_the_wheels_ggml_is_accepted_and_says_what_it_is() -> None:
    ggml = _wheel_or_skip()
    assert (ggml.version, ggml.commit) == (api.GGML_VERSION, api.GGML_COMMIT)
    for name, (restype, argtypes) in {**api.BASE, **api.CPU}.items():
        function = getattr(ggml, name)
        assert function.restype == restype and list(function.argtypes) == argtypes, name


def test_a_library_lacking_a_declared_symbol_is_refused_with_one_line() -> None:
    """libc stands in for a ggml without our symbols (as another build's could lack one)."""
    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no libc to stand in")
    _wheel_or_skip()
    base, cpu = api.library_paths(api.wheel_folder())
    with pytest.raises(api.GgmlApiError) as err:
        api.load_from(Path(libc), cpu)
    assert "lacks the ggml function(s) ggml_version" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(api.GgmlApiError, match="lacks the ggml function"):
        api.load_from(base, Path(libc))  # the CPU backend's symbols are checked too


def test_another_ggml_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _wheel_or_skip()
    monkeypatch.setattr(api, "GGML_VERSION", "0.16.0")
    with pytest.raises(api.GgmlApiError, match=r"is ggml 0\.17\.0 \(build c044c6f\); this engine's declarations are for ggml 0\.16\.0"):
        api.load_from(*api.library_paths(api.wheel_folder()))


def test_a_cpu_the_wheel_cannot_run_is_refused_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    from wyoming_qwen3tts.engine.cpu import ggml

    monkeypatch.setattr(api, "_LOADED", None)
    monkeypatch.setattr(ggml, "native_support", lambda: (False, "the CPU lacks AVX2"))
    with pytest.raises(api.GgmlApiError, match="^the CPU lacks AVX2$"):
        api.load()


def test_a_missing_library_is_refused(tmp_path: Path) -> None:
    with pytest.raises(api.GgmlApiError, match="does not load"):
        api.load_from(tmp_path / "libggml-base.so.0", tmp_path / "libggml-cpu.so.0")


# --- generation against the float32 lean modules ----------------------------------------------

GGML_CHECKPOINTS = Path(os.environ.get("QWEN3TTS_TEST_GGML_CHECKPOINTS", CHECKPOINTS.parent / "ggml"))
TEXT = "Hello there, this is a test of the CPU engine."
#: Frames compared a case (each a talker step and the predictor's 15 passes).
FRAMES = 10
_T = np.arange(2 * 16000) / 16000
ICL_CLIP = Reference.from_audio((0.2 * np.sin(2 * np.pi * 180 * _T)).astype(np.float32), 16000, CLONE_TRANSCRIPT)
XVEC_CLIP = Reference.from_audio((0.2 * np.sin(2 * np.pi * 130 * _T)).astype(np.float32), 16000, None)


def _greedy(**kw: Any) -> Segment:
    """A greedy segment of ``FRAMES`` frames, EOS held back throughout (as the lean loop)."""
    return Segment(**{"text": TEXT, "language": "english", "max_new_tokens": FRAMES, "min_new_tokens": FRAMES,
                      "seed": 1, "sampling": Sampling.greedy(), **kw})


#: Every voice kind: (case id, model kind, segment).
CASES: list[tuple[str, ModelKind, Segment]] = [
    ("speaker", ModelKind.CUSTOM_VOICE, _greedy(speaker="ryan")),
    ("speaker-instruct", ModelKind.CUSTOM_VOICE, _greedy(speaker="Ryan", instruct="Speak slowly.")),
    ("speaker-auto", ModelKind.CUSTOM_VOICE, _greedy(speaker="ryan", language="auto")),
    ("dialect-chinese", ModelKind.CUSTOM_VOICE, _greedy(speaker="eric", language="chinese", text="你好，今天天气很好。")),
    ("design", ModelKind.VOICE_DESIGN, _greedy(instruct="A calm, low voice.")),
    ("design-no-instruct", ModelKind.VOICE_DESIGN, _greedy()),
    ("clone-icl", ModelKind.BASE, _greedy(reference=ICL_CLIP)),
    ("clone-xvector", ModelKind.BASE, _greedy(reference=XVEC_CLIP)),
]
CASE_IDS = [c[0] for c in CASES]


@dataclass
class Expected:
    """qwen_tts's talker inputs of a case and the lean modules' greedy codes from them."""

    embeds: np.ndarray  # float32 [P, hidden]
    pad: np.ndarray  # float32 [hidden]
    codes: np.ndarray  # int64 [FRAMES, 16]


@pytest.fixture(scope="module")
def gguf_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[ModelKind, str], Path]:
    """GGUF folders of the ``--size ggml`` checkpoints, F32 and Q8_0 of each kind (and Q4_0
    of CustomVoice), written by
    our converter: its talker file, and one codec file (the Base checkpoint's, Q8_0) linked
    into every folder (only a Base clone's extraction reads it; writing it six times would
    cost most of this module's time)."""
    from wyoming_qwen3tts.gguf import _write_codec, _write_talker, output_names
    from wyoming_qwen3tts.testing.checkpoint import build_all

    _wheel_or_skip()
    build_all(GGML_CHECKPOINTS, "ggml")
    out = tmp_path_factory.mktemp("gguf")
    codec = out / "qwen-tokenizer-12hz-Q8_0.gguf"
    _write_codec(GGML_CHECKPOINTS / "base" / "speech_tokenizer", codec, "Q8_0")
    folders = {}
    for kind in ModelKind:
        config = json.loads((GGML_CHECKPOINTS / kind.value / "config.json").read_text())
        for quant in ("F32", "Q8_0", "Q4_0") if kind is ModelKind.CUSTOM_VOICE else ("F32", "Q8_0"):
            folder = folders[kind, quant] = out / f"{kind.value}-{quant}"
            folder.mkdir()
            _write_talker(GGML_CHECKPOINTS / kind.value, folder / output_names(config, quant)[0], quant)
            os.link(codec, folder / codec.name)
    return folders


@pytest.fixture(scope="module")
def sources(gguf_folders: dict[tuple[ModelKind, str], Path]) -> Iterator[dict[tuple[ModelKind, str], GgmlFrameSource]]:
    """A frame source a (kind, format), one thread; Base ones clone in context, sharing one
    wheel extraction of each clip."""
    from wyoming_qwen3tts.engine.cpu.gguf_files import find_pair
    from wyoming_qwen3tts.engine.cpu.native.voice_refs import WheelVoiceRefs

    pair = find_pair(gguf_folders[ModelKind.BASE, "F32"])
    assert pair is not None
    refs = WheelVoiceRefs(*pair, keep_context=True)
    loaded = {
        key: GgmlFrameSource(folder, 1, icl=True, voice_refs=refs if key[0] is ModelKind.BASE else None)
        for key, folder in gguf_folders.items()
    }
    yield loaded
    for source in loaded.values():
        source.close()
    refs.close()


@pytest.fixture(scope="module")
def expected(sources: dict[tuple[ModelKind, str], GgmlFrameSource]) -> dict[str, Expected]:
    """Each case through qwen_tts (float32; its ``generate_*`` stopped at the talker, whose
    inputs are kept) and the lean modules (greedy codes from those inputs). Clones get the
    x-vector and codes the wheel extracts (what our source uses), as a qwen_tts prompt item."""
    import torch
    from qwen_tts import Qwen3TTSModel
    from qwen_tts.inference.qwen3_tts_model import VoiceClonePromptItem

    from wyoming_qwen3tts.testing.lean import lean_codes, talker_inputs

    out: dict[str, Expected] = {}
    common = dict(max_new_tokens=FRAMES + 1, do_sample=False, subtalker_dosample=False, repetition_penalty=1.0,
                  non_streaming_mode=True)
    for kind in ModelKind:
        qwen = Qwen3TTSModel.from_pretrained(str(GGML_CHECKPOINTS / kind.value), device_map="cpu", dtype=torch.float32)
        for case, case_kind, s in CASES:
            if case_kind is not kind:
                continue
            call: Callable[[], Any]
            if kind is ModelKind.CUSTOM_VOICE:
                call = lambda s=s: qwen.generate_custom_voice(text=s.text, speaker=s.speaker, language=s.language,
                                                              instruct=s.instruct, **common)
            elif kind is ModelKind.VOICE_DESIGN:
                call = lambda s=s: qwen.generate_voice_design(text=s.text, instruct=s.instruct or "",
                                                              language=s.language, **common)
            else:
                assert s.reference is not None
                voice = sources[kind, "F32"].clone_voice(s.reference)
                item = VoiceClonePromptItem(
                    ref_code=None if voice.codes is None else torch.from_numpy(voice.codes),
                    ref_spk_embedding=torch.from_numpy(voice.speaker), x_vector_only_mode=voice.codes is None,
                    icl_mode=voice.codes is not None, ref_text=voice.transcript)
                call = lambda s=s, item=item: qwen.generate_voice_clone(text=s.text, language=s.language,
                                                                        voice_clone_prompt=[item], **common)
            inputs = talker_inputs(qwen, call)
            out[case] = Expected(inputs["inputs_embeds"][0].numpy(), inputs["tts_pad_embed"][0, 0].numpy(),
                                 lean_codes(qwen, inputs, FRAMES))
        del qwen
    return out


@pytest.mark.parametrize("case", CASE_IDS)
def test_the_prompt_equals_qwen_tts(sources: dict, expected: dict[str, Expected], case: str) -> None:
    """The prompt built from the GGUF file (text rows, ggml text projection, codec rows) is
    qwen_tts's, to float32 rounding, for every voice kind."""
    _, kind, segment = next(c for c in CASES if c[0] == case)
    prompt = sources[kind, "F32"].prompt(segment)
    assert prompt.embeds.shape == expected[case].embeds.shape
    np.testing.assert_allclose(prompt.embeds, expected[case].embeds, rtol=0, atol=1e-6)
    np.testing.assert_allclose(prompt.pad, expected[case].pad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", CASE_IDS)
def test_greedy_float32_codes_equal_the_lean_modules(sources: dict, expected: dict[str, Expected], case: str) -> None:
    """F32 weights: every code of every frame equals the float32 lean modules'."""
    _, kind, segment = next(c for c in CASES if c[0] == case)
    codes = np.array(list(sources[kind, "F32"].frames(segment)))
    assert codes.shape == (FRAMES, 16) and codes.dtype == np.int64
    np.testing.assert_array_equal(codes, expected[case].codes)


def test_8_bit_weights_keep_a_share_of_the_codes(sources: dict, expected: dict[str, Expected]) -> None:
    """Q8_0 weights (ggml also rounds the activations to 8 bits for each product): the share
    of codes equal to the float32 lean modules' over ``FRAMES`` frames, every voice kind.
    Random weights have near-flat logits, so one rounding turns a code, and the frames after
    a turned first code follow another path: the share is a floor (issue 26 measured 2.1 %
    of Q4_0 codes equal to Q8_0's over 200 frames); a broken graph would leave ~1/2048."""
    shares = {}
    for case, kind, segment in CASES:
        codes = np.array(list(sources[kind, "Q8_0"].frames(segment)))
        assert codes.shape == (FRAMES, 16)
        shares[case] = float((codes == expected[case].codes).mean())
    print("Q8_0 share of codes equal to the float32 lean modules':", shares)
    assert min(shares.values()) > 0.02 and np.mean(list(shares.values())) > 0.3, shares


def test_4_bit_layer_matrices_are_repacked_and_generate(sources: dict, expected: dict[str, Expected]) -> None:
    """Q4_0 (the converter's 4-bit layer matrices): on AVX2 they go to ggml's CPU_REPACK
    buffer (as qwentts.cpp places them) and generate; the share of codes equal to float32 is
    printed (4 bits on random weights: a floor, see the 8-bit test)."""
    source = sources[ModelKind.CUSTOM_VOICE, "Q4_0"]
    if source.ggml.ggml_cpu_has_avx2():
        assert source.runtime.repack_type is not None and source.weights.repacked >= 7 * source.file.talker.layers
    codes = np.array(list(source.frames(CASES[0][2])))
    assert codes.shape == (FRAMES, 16) and ((codes >= 0) & (codes < 3072)).all()
    print("Q4_0 share of codes equal to float32 (speaker):", float((codes == expected["speaker"].codes).mean()))


# --- the frame loop: sampling, stopping, errors ------------------------------------------------


def test_the_sampler_draws_the_batched_engines_random_numbers() -> None:
    """The numpy sampler's uniforms are the batched engine's, bit for bit (same seed, frame and
    draw give the same numbers on either engine); its Gumbel noise to float32 rounding."""
    import torch

    from wyoming_qwen3tts.engine.batched import sampling as batched
    from wyoming_qwen3tts.engine.cpu.native import sampling

    for seed, counter, stream in [(0, 0, 0), (1234, 7, 3), (2**63 - 1, 2**31 + 5, 15), (987654321987, 200, 0)]:
        theirs = batched.uniform(torch.tensor([seed]), torch.tensor([[counter]]), torch.tensor([stream]),
                                 sampling.CANDIDATES)[0, 0].numpy()
        np.testing.assert_array_equal(sampling.uniform(seed, counter, stream), theirs)
        np.testing.assert_allclose(sampling.gumbel(seed, counter, stream), -np.log(-np.log(theirs)), rtol=1e-6)


def test_the_sampler_follows_the_batched_engines_rules() -> None:
    """Same picks as ``batched.sampling.sample`` on the same logits and noise, for settings
    with and without top-k/top-p; greedy is the argmax; EOS is held back until allowed;
    control ids are never picked; the repetition penalty lowers an id already picked."""
    import torch

    from wyoming_qwen3tts.engine.batched import sampling as batched
    from wyoming_qwen3tts.engine.cpu.native.sampling import CANDIDATES, FrameSampler, gumbel, pick

    rng = np.random.default_rng(3)
    for temperature, top_k, top_p in [(0.9, 50, 1.0), (0.7, 5, 0.8), (1.3, 0, 0.5), (0.0, 50, 1.0)]:
        for draw in range(20):
            logits = (rng.standard_normal(2048) * 3).astype(np.float32)
            noise = gumbel(draw, 0, 1)
            k, p = batched.effective(top_k, top_p)
            params = batched.RowParams(torch.tensor([temperature]), torch.tensor([k]), torch.tensor([p]))
            theirs = int(batched.sample(torch.from_numpy(logits)[None], params, torch.from_numpy(noise)[None])[0])
            assert pick(logits, temperature, top_k, top_p, noise) == theirs
    vocab, eos = 3072, 2150
    logits = np.zeros(vocab, dtype=np.float32)
    logits[eos], logits[vocab - 1], logits[10], logits[11] = 9.0, 50.0, 5.0, 4.9
    sampler = FrameSampler(Sampling(0.0, 0, 1.0, 1.5, 0.0, 0, 1.0), seed=1, vocab=vocab, eos=eos)
    assert sampler.first(logits, 0, allow_eos=True) == eos  # the control id above it is suppressed
    assert sampler.first(logits, 1, allow_eos=False) == 10  # EOS held back
    assert sampler.first(logits, 2, allow_eos=False) == 11  # 10 was picked: 5.0 / 1.5 < 4.9
    assert CANDIDATES == batched.CANDIDATES


def test_a_seed_replays_its_frames_and_another_differs(sources: dict) -> None:
    source = sources[ModelKind.CUSTOM_VOICE, "Q8_0"]
    segment = Segment(TEXT, "english", 6, 6, seed=1234, speaker="ryan")  # the default sampling
    first = np.array(list(source.frames(segment)))
    assert first.shape == (6, 16)
    np.testing.assert_array_equal(np.array(list(source.frames(segment))), first)
    other = np.array(list(source.frames(Segment(TEXT, "english", 6, 6, seed=99, speaker="ryan"))))
    assert not np.array_equal(other, first)


def test_frames_stop_at_the_cap_at_eos_and_when_cancelled(sources: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from wyoming_qwen3tts.engine.cpu.native.sampling import FrameSampler

    source = sources[ModelKind.CUSTOM_VOICE, "F32"]
    assert len(list(source.frames(_greedy(speaker="ryan", max_new_tokens=3, min_new_tokens=2)))) == 3
    assert list(source.frames(_greedy(speaker="ryan", max_new_tokens=0))) == []
    # cancelled after the second frame: no third
    made: list[np.ndarray] = []
    frames = source.frames(_greedy(speaker="ryan", max_new_tokens=50), cancelled=lambda: len(made) >= 2)
    for frame in frames:
        made.append(frame)
    assert len(made) == 2
    # cancelled during the prefill: ggml asks between the graph's nodes and stops there
    asked = []
    stop = lambda: asked.append(1) or len(asked) >= 5  # noqa: E731
    assert list(source.frames(_greedy(speaker="ryan"), cancelled=stop)) == [] and len(asked) == 5
    assert len(list(source.frames(_greedy(speaker="ryan", max_new_tokens=2)))) == 2  # and serves on
    # EOS drawn at frame 4 ends the segment there, without a frame for it; min_new_tokens
    # reaches the sampler as the frames EOS is held back for
    real = FrameSampler.first
    allowed: list[bool] = []

    def first(self: FrameSampler, logits: np.ndarray, frame: int, allow_eos: bool) -> int:
        allowed.append(allow_eos)
        return self.eos if frame == 4 else real(self, logits, frame, allow_eos)

    monkeypatch.setattr(FrameSampler, "first", first)
    codes = list(source.frames(_greedy(speaker="ryan", max_new_tokens=50, min_new_tokens=3)))
    assert len(codes) == 4 and allowed == [False, False, False, True, True]


def test_the_talkers_cache_grows_during_a_segment_without_changing_its_codes(
    sources: dict, expected: dict[str, Expected], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache starts at the prompt plus ``CACHE_STEP`` positions and grows by copying:
    with a step of 1 it grows within the segment, and the codes stay the float32 ones."""
    from wyoming_qwen3tts.engine.cpu.native import graphs

    source = sources[ModelKind.CUSTOM_VOICE, "F32"]
    talker = source.talker
    assert talker.cache is not None
    talker.cache.close()
    talker.cache = None
    monkeypatch.setattr(graphs, "CACHE_STEP", 1)
    sizes: list[int] = []
    real = graphs.KvCache.__init__

    def made(self: graphs.KvCache, backend: Any, layers: int, width: int, capacity: int) -> None:
        sizes.append(capacity)
        real(self, backend, layers, width, capacity)

    monkeypatch.setattr(graphs.KvCache, "__init__", made)
    codes = np.array(list(source.frames(CASES[0][2])))
    prompt = len(expected["speaker"].embeds)
    assert sizes == [prompt + 1, prompt + FRAMES]  # the prompt's, then grown once to the cap
    np.testing.assert_array_equal(codes, expected["speaker"].codes)


def test_more_threads_give_the_same_codes(sources: dict, expected: dict[str, Expected]) -> None:
    source = sources[ModelKind.VOICE_DESIGN, "F32"]
    source.set_threads(2)
    try:
        assert source.threads == 2
        np.testing.assert_array_equal(np.array(list(source.frames(CASES[4][2]))), expected["design"].codes)
    finally:
        source.set_threads(1)


def test_bad_segments_fail_clearly_and_one_generation_runs_at_a_time(sources: dict) -> None:
    custom, base = sources[ModelKind.CUSTOM_VOICE, "F32"], sources[ModelKind.BASE, "F32"]
    assert "ryan" in custom.speakers() and "eric" in custom.speakers() and base.speakers() == []
    with pytest.raises(ValueError, match="unknown speaker 'nobody'.*ryan"):
        list(custom.frames(_greedy(speaker="nobody")))
    with pytest.raises(ValueError, match="unsupported language 'klingon'"):
        list(custom.frames(_greedy(speaker="ryan", language="klingon")))
    with pytest.raises(ValueError, match="needs a reference clip"):
        list(base.frames(_greedy()))
    with pytest.raises(ValueError, match="clones no voices"):
        custom.clone_voice(ICL_CLIP)
    running = custom.frames(_greedy(speaker="ryan"))
    next(running)
    with pytest.raises(RuntimeError, match="generating another segment"):
        next(custom.frames(_greedy(speaker="ryan")))
    running.close()
    assert len(list(custom.frames(_greedy(speaker="ryan", max_new_tokens=2)))) == 2


def test_an_in_context_clone_hands_out_its_reference_codes(sources: dict) -> None:
    """The codec decoder needs an ICL clip's codes as its left context; x-vector clones have none."""
    base = sources[ModelKind.BASE, "F32"]
    codes = base.reference_codes(ICL_CLIP)
    assert codes is not None and codes.dtype == np.int64 and codes.shape[1] == 16 and len(codes) >= 25
    assert base.reference_codes(XVEC_CLIP) is None


def test_files_that_are_not_talker_ggufs_are_refused_not_crashed(gguf_folders: dict, tmp_path: Path) -> None:
    """ggml's own GGUF reader aborts the process on a value of an unexpected type: every
    key's type is checked first, and other files are refused with the reason."""
    from wyoming_qwen3tts.engine.cpu.native.weights import TalkerFile, WeightsError

    ggml = _wheel_or_skip()
    folder = gguf_folders[ModelKind.CUSTOM_VOICE, "F32"]
    with pytest.raises(WeightsError, match="'qwen3-tts-tokenizer' GGUF, not a qwen3-tts talker"):
        TalkerFile(ggml, next(folder.glob("*tokenizer*.gguf")))
    bad = tmp_path / "qwen-talker-bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(WeightsError, match="not a GGUF file ggml reads"):
        TalkerFile(ggml, bad)
    cut = tmp_path / "qwen-talker-cut.gguf"
    talker = next(folder.glob("*talker*.gguf"))
    cut.write_bytes(talker.read_bytes()[: talker.stat().st_size // 2])
    with pytest.raises(WeightsError):
        TalkerFile(ggml, cut)


def test_generation_holds_no_torch(gguf_folders: dict) -> None:
    """The frame source (prompt, graphs, sampling) imports none of PyTorch, transformers or
    qwen_tts: a fresh interpreter generates frames and lists what it loaded."""
    import subprocess
    import sys

    script = (
        "import sys; from pathlib import Path\n"
        "from wyoming_qwen3tts.engine import Segment\n"
        "from wyoming_qwen3tts.engine.cpu.native.generator import GgmlFrameSource\n"
        f"source = GgmlFrameSource(Path({str(gguf_folders[ModelKind.CUSTOM_VOICE, 'Q8_0'])!r}), 1)\n"
        "frames = list(source.frames(Segment('Hello.', 'english', 3, seed=1, speaker='ryan')))\n"
        "print(len(frames), [m for m in ('torch', 'transformers', 'qwen_tts', 'faster_qwen3_tts') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "3 []"
