"""Random Qwen3-TTS checkpoints load and speak through the real loaders.

The tiny checkpoints are built once per session by the command line (``--all``), then
loaded with ``qwen_tts.Qwen3TTSModel.from_pretrained`` on the CPU. Random weights almost
never emit EOS, so every generate call caps ``max_new_tokens``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wyoming_qwen3tts.testing import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[1]
MAX_FRAMES = 6


@pytest.fixture(scope="module", autouse=True)
def torch_one_thread():
    """One torch thread: on small CPUs the tiny models run several times faster so."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """The three tiny checkpoints, written by ``python -m ... --size tiny --all DIR``."""
    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cli = [sys.executable, "-m", "wyoming_qwen3tts.testing.checkpoint", "--size", "tiny"]
    proc = subprocess.run(
        [*cli, "--all", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [str(out / t) for t in ckpt.MODEL_TYPES]
    # Dependencies' banners (flash-attn, SoX) stay out of a first run's output, as in the server's.
    assert "SoX" not in proc.stderr and "sox: not found" not in proc.stderr, proc.stderr[-2000:]
    assert "flash" not in proc.stderr.lower(), proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def load(tiny_dir, torch_one_thread):
    """model type -> loaded ``Qwen3TTSModel`` (float32, CPU), loaded on first use."""
    from qwen_tts import Qwen3TTSModel

    cache = {}

    def _load(model_type: str):
        if model_type not in cache:
            cache[model_type] = Qwen3TTSModel.from_pretrained(
                str(tiny_dir / model_type), device_map="cpu", dtype=torch_one_thread.float32
            )
        return cache[model_type]

    return _load


def assert_noise_audio(wavs, sr) -> None:
    """One float32 waveform at 24 kHz, whole codec frames, finite, audible."""
    assert sr == ckpt.SAMPLE_RATE == 24000
    assert isinstance(wavs, list) and len(wavs) == 1
    wav = wavs[0]
    assert isinstance(wav, np.ndarray) and wav.dtype == np.float32 and wav.ndim == 1
    frames, rest = divmod(wav.shape[0], ckpt.SAMPLES_PER_FRAME)
    assert rest == 0 and 1 <= frames <= MAX_FRAMES, wav.shape
    assert np.isfinite(wav).all() and np.abs(wav).max() <= 1.0
    rms = float(np.sqrt(np.mean(wav**2)))
    assert 0.02 < rms < 0.5, rms


def test_cli_all_writes_three_complete_folders(tiny_dir):
    from safetensors import safe_open

    for model_type in ckpt.MODEL_TYPES:
        folder = tiny_dir / model_type
        config = json.loads((folder / "config.json").read_text())
        assert config["tts_model_type"] == model_type
        mrope = config["talker_config"]["rope_scaling"]["mrope_section"]
        assert mrope == list(ckpt.TINY.mrope_section)
        for name in (
            "generation_config.json", "vocab.json", "merges.txt", "tokenizer_config.json",
            "speech_tokenizer/config.json", "speech_tokenizer/preprocessor_config.json",
        ):
            assert (folder / name).is_file(), name
        assert ckpt.is_complete(folder, model_type, "tiny", 0)
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            keys = list(f.keys())
            assert f.get_tensor(keys[0]).dtype.is_floating_point
            numel = sum(int(np.prod(f.get_slice(k).get_shape())) for k in keys)
        assert (numel, len(keys)) == ckpt.count_parameters(model_type, "tiny")
        assert any(k.startswith("speaker_encoder.") for k in keys) == (model_type == "base")
    codec = "speech_tokenizer/model.safetensors"
    assert len({(tiny_dir / t / codec).read_bytes() for t in ckpt.MODEL_TYPES}) == 1


def test_rebuild_is_skipped_and_seed_decides_the_weights(tiny_dir, tmp_path):
    model = tiny_dir / "base" / "model.safetensors"
    mtime = model.stat().st_mtime_ns
    assert ckpt.build_checkpoint(tiny_dir / "base", "base", "tiny") == tiny_dir / "base"
    assert model.stat().st_mtime_ns == mtime

    again = ckpt.build_checkpoint(tmp_path / "same", "voice_design", "tiny", seed=0)
    other = ckpt.build_checkpoint(tmp_path / "other", "voice_design", "tiny", seed=1)
    reference = (tiny_dir / "voice_design" / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == reference
    assert (other / "model.safetensors").read_bytes() != reference


def test_full_size_has_the_released_parameter_counts():
    assert ckpt.count_parameters("base", "full") == (1_928_677_440, 480)
    assert ckpt.count_parameters("voice_design", "full") == (1_916_676_352, 404)
    assert ckpt.count_parameters("custom_voice", "full") == (1_916_676_352, 404)
    assert ckpt.count_codec_parameters("full") == (170_557_441, 496)


def test_text_tokenizer_keeps_real_special_ids_and_takes_any_text(load):
    tok = load("voice_design").processor.tokenizer
    text = "Grüße aus Köln, 你好, 👋🏽!"
    ids = tok(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    assert ids[:3] == [151644, 77091, 198]
    assert ids[-5:] == [151645, 198, 151644, 77091, 198]
    assert tok.decode(ids[3:-5]) == text
    for token, token_id in ckpt.SPECIAL_TEXT_TOKENS.items():
        assert tok.convert_tokens_to_ids(token) == token_id
    assert max(ids) < ckpt.TEXT_VOCAB_SIZE


def test_voice_clone_with_transcript_and_x_vector_only(load, torch_one_thread, tmp_path):
    import soundfile as sf

    model = load("base")
    t = np.arange(int(1.5 * ckpt.SAMPLE_RATE)) / ckpt.SAMPLE_RATE
    ref = (0.2 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    ref_path = tmp_path / "ref.wav"
    sf.write(ref_path, ref, ckpt.SAMPLE_RATE)

    items = model.create_voice_clone_prompt(ref_audio=str(ref_path), ref_text="A short reference.")
    code = items[0].ref_code
    assert code.shape == (-(-len(ref) // ckpt.SAMPLES_PER_FRAME), ckpt.NUM_CODE_GROUPS)
    assert 0 <= int(code.min()) and int(code.max()) < ckpt.CODEBOOK_SIZE
    assert items[0].ref_spk_embedding.shape == (ckpt.TINY.talker_hidden,)

    torch_one_thread.manual_seed(0)
    wavs, sr = model.generate_voice_clone(
        text="Hallo Welt.", language="German", ref_audio=str(ref_path),
        ref_text="A short reference.", max_new_tokens=MAX_FRAMES,
    )
    assert_noise_audio(wavs, sr)
    wavs, sr = model.generate_voice_clone(
        text="Hello world.", language="Auto", ref_audio=(ref, ckpt.SAMPLE_RATE),
        x_vector_only_mode=True, max_new_tokens=MAX_FRAMES,
    )
    assert_noise_audio(wavs, sr)


def test_voice_design_follows_instruct(load, torch_one_thread):
    model = load("voice_design")
    torch_one_thread.manual_seed(0)
    wavs, sr = model.generate_voice_design(
        text="Hello world.", instruct="A calm, low female voice.", language="English",
        max_new_tokens=MAX_FRAMES,
    )
    assert_noise_audio(wavs, sr)


def test_custom_voice_has_the_released_speakers(load, torch_one_thread):
    model = load("custom_voice")
    assert model.get_supported_speakers() == sorted(ckpt.SPEAKERS)
    assert model.get_supported_languages() == sorted(["auto", *ckpt.LANGUAGE_IDS])
    torch_one_thread.manual_seed(0)
    wavs, sr = model.generate_custom_voice(
        text="你好，世界。", speaker="Dylan", language="Chinese", max_new_tokens=MAX_FRAMES,
    )
    assert_noise_audio(wavs, sr)
    wavs, sr = model.generate_custom_voice(
        text="Hello world.", speaker="Vivian", language="English", instruct="Whisper.",
        max_new_tokens=MAX_FRAMES,
    )
    assert_noise_audio(wavs, sr)


@pytest.mark.gpu
def test_faster_qwen3_tts_streams_a_tiny_checkpoint(tiny_dir):
    """faster-qwen3-tts (CUDA graphs) loads the folder and streams whole-frame chunks."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from faster_qwen3_tts import FasterQwen3TTS

    model = FasterQwen3TTS.from_pretrained(str(tiny_dir / "voice_design"), max_seq_len=256)
    chunks = list(model.generate_voice_design_streaming(
        text="Hello world.", instruct="A calm voice.", language="English",
        max_new_tokens=8, min_new_tokens=8, chunk_size=2,
    ))
    assert len(chunks) == 4
    for audio, sr, timing in chunks:
        assert sr == 24000 and audio.dtype == np.float32
        assert audio.shape == (2 * ckpt.SAMPLES_PER_FRAME,)
        assert timing["chunk_steps"] == 2
    audio = np.concatenate([c[0] for c in chunks])
    assert 0.02 < float(np.sqrt(np.mean(audio**2))) < 0.5
