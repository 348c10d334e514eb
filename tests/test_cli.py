"""Bad command lines fail fast, before the model load, with a one-line reason."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # Port 0 unless a test names one: the default 10200 may be taken (a real server on this machine).
        [sys.executable, "-m", "wyoming_qwen3tts", "--no-zeroconf", "--http-port", "0", "--uri", "tcp://127.0.0.1:0", *args],
        capture_output=True, text=True, timeout=300, cwd=cwd,
    )


def run_clone_alone(tmp_path: Path, voices: Path, checkpoints: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """The server with the tiny Base model alone on the CPU's reference engine and ``voices``
    as its folder, started as a user starts it (``run_cli``), with ``flags`` added."""
    return run_cli(
        "--data-dir", str(tmp_path), "--voices-dir", str(voices), "--clone-model", str(checkpoints / "base"),
        "--design-model", "none", "--custom-voice-model", "none", "--device", "cpu", "--engine", "reference",
        *flags, cwd=tmp_path,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--chunk-size", "0"], "--chunk-size must be at least 1"),
        (["--fixed-frames", "-3"], "--fixed-frames must be at least 1"),
        (["--max-chars", "0"], "--max-chars must be at least 1"),
        (["--max-streams", "0"], "--max-streams must be at least 1"),
        (["--ggml-threads", "-1"], "--ggml-threads must be 0 (auto) or more"),
        (["--generation-threads", "-2"], "--generation-threads must be 0 (auto) or more"),
        (["--codec-threads", "-1"], "--codec-threads must be 0 (auto) or more"),
        (["--gpu-memory", "0"], "--gpu-memory must be more than 0 GB"),
        (["--seed", "1180591620717411303424"], "--seed must be 0..4294967295"),
        (["--seed", "-1"], "--seed must be 0..4294967295"),
        (["--uri", "http://127.0.0.1:1234"], "--uri http://127.0.0.1:1234"),
        (["--drain-seconds", "-1"], "--drain-seconds must be 0..600"),
        (["--zeroconf-address", "balancer"], "--zeroconf-address must be HOST:PORT or :PORT"),
        (["--zeroconf-address", ":70000"], "--zeroconf-address must be HOST:PORT or :PORT"),
        (["--clone-model", "none", "--design-model", "none", "--custom-voice-model", "none", "--device", "cpu"], "No model enabled"),
        (["--clone-model", "./no-such-folder", "--design-model", "none", "--device", "cpu"], "does not exist"),
        (["--clone-model", "Qwen/Qwen3-TTS-12Hz-1.7B-Base", "--design-model", "none", "--device", "cpu", "--local-files-only"], "--local-files-only"),
    ],
)
def test_bad_settings_exit_with_a_reason(tmp_path: Path, voices_dir: Path, args: list[str], message: str) -> None:
    # A clone voice in the folder: the Base model alone would otherwise stop at "No voices" first.
    result = run_cli("--data-dir", str(tmp_path), "--voices-dir", str(voices_dir), *args, cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        (["--engine", "ggml"], "No published GGUF for 'tiny/base' (known: "),
        (["--engine", "reference", "--local-files-only"], "Cannot get model 'tiny/base' (--local-files-only is set"),
    ],
)
def test_a_model_option_that_may_be_a_folder_says_no_such_folder_exists(
    tmp_path: Path, voices_dir: Path, engine: list[str], message: str
) -> None:
    """``--clone-model tiny/base`` (a relative folder, mistyped or not made yet, without "./")
    is also a hub id's form: start-up said only that no such model is published, so the
    missing folder was not obvious. Now the reason names the folder it looked for."""
    result = run_cli("--data-dir", str(tmp_path), "--voices-dir", str(voices_dir), "--clone-model", "tiny/base",
                     "--design-model", "none", "--custom-voice-model", "none", "--device", "cpu", *engine, cwd=tmp_path)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert message in last, result.stderr[-2000:]
    assert last.endswith(f"; no folder {tmp_path / 'tiny' / 'base'} exists either"), last
    assert "Traceback" not in result.stderr


def test_port_in_use_fails_before_loading(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("--uri", f"tcp://127.0.0.1:{port}", "--data-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Loading" not in result.stderr


def test_http_port_equal_to_the_wyoming_port_fails_before_loading(tmp_path: Path) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    result = run_cli(
        "--uri", f"tcp://127.0.0.1:{port}", "--http-host", "127.0.0.1", "--http-port", str(port),
        "--data-dir", str(tmp_path), cwd=tmp_path,
    )
    assert result.returncode != 0
    assert f"--http-port: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr, result.stderr[-2000:]
    assert "Loading" not in result.stderr and "Traceback" not in result.stderr


def test_unwritable_folders_fail_before_loading(tmp_path: Path) -> None:
    """A data or voices folder that cannot be made is refused at once, not after minutes of
    loading (a file stands where a parent folder should be: refused for root too)."""
    blocked = tmp_path / "blocked"
    blocked.write_text("not a folder")
    target = blocked / "data"
    # Under the file, or the file itself named as the folder: said in those words, not "File exists".
    for folder, said in ((target, "cannot write there"), (blocked, "is a file, not a folder")):
        for args, flag in (
            (["--data-dir", str(folder)], "--data-dir"),
            (["--data-dir", str(tmp_path / "ok"), "--voices-dir", str(folder)], "--voices-dir"),
        ):
            result = run_cli(*args, cwd=tmp_path)
            assert result.returncode != 0
            assert f"{flag} {folder}: {said}" in result.stderr, result.stderr[-2000:]
            assert "Loading" not in result.stderr and "Traceback" not in result.stderr


def test_a_voices_folder_whose_parent_is_missing_too_is_refused_before_loading(tmp_path: Path) -> None:
    """``--voices-dir /data/voises/x`` (a typo in a folder above it): the whole path was
    created silently, and the server served an empty library. Now start-up stops at once,
    naming the folder and its missing parent, and creates nothing. The default's own path
    spelled out (``DATA_DIR/voices``, as the Docker image passes it) is still created quietly."""
    typo = tmp_path / "voises" / "mine"
    result = run_cli("--data-dir", str(tmp_path / "data"), "--voices-dir", str(typo), cwd=tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (f"--voices-dir {typo}: the folder {typo} does not exist, nor its parent {typo.parent}: check the "
                    f"path for a typo, or create the folder first (mkdir -p {typo})"), last
    assert not typo.parent.exists()
    assert "Loading" not in result.stderr and "Traceback" not in result.stderr
    # The default's path named (the clone model alone, no studio, no clip: it stops at "No voices" next).
    result = run_cli("--data-dir", str(tmp_path / "data"), "--voices-dir", str(tmp_path / "data" / "voices"),
                     "--clone-model", "./no-such-folder", "--design-model", "none", "--custom-voice-model", "none",
                     "--device", "cpu", "--local-files-only", cwd=tmp_path)
    assert "No voices: " in result.stderr and (tmp_path / "data" / "voices").is_dir(), result.stderr[-2000:]
    assert " WARNING " not in result.stderr, result.stderr[-2000:]


@pytest.mark.full
async def test_a_new_voices_folder_is_named_in_a_warning_and_several_first_voices_say_which_rule_chose_the_default(
    checkpoints: Path, tmp_path: Path
) -> None:
    """The real server with the clone model alone and ``--voices-dir`` naming a folder that
    does not exist (``voises``: a typo) beside one that does: it was created silently, so the
    user saw only "no voice yet". Now a WARNING names the new, empty folder by its absolute
    path. Then three clips are copied in at once and found by one scan: the default voice was
    logged as "the first voice added", which it was not (``amy``, copied second, is the first
    by name); the log now says which rule chose it."""
    import aiohttp

    from .conftest import start_server, stop_server

    typo = tmp_path / "voises"
    srv = start_server(
        checkpoints, typo, tmp_path / "server.log",
        extra=["--no-zeroconf", "--design-model", "none", "--custom-voice-model", "none"],
    )
    try:
        log = srv.output()
        assert (f"WARNING wyoming_qwen3tts: --voices-dir {typo}: the folder {typo} did not exist, so it was created, "
                "empty. If the path is mistyped, stop the server and name the right folder") in log, log[-3000:]
        assert ("0 voice(s); default none yet: the first voice added (aria if there is one, else the first by name, "
                "where several are added together)") in log, log[-3000:]
        t = np.arange(2 * 24000) / 24000
        for name, freq in (("zed", 150.0), ("amy", 200.0), ("bob", 250.0)):
            sf.write(typo / f".{name}.wav", (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 24000, format="WAV")
            (typo / f".{name}.wav").rename(typo / f"{name}.wav")
        async with aiohttp.ClientSession() as session, session.get(srv.http_url + "/v1/audio/voices") as resp:
            listing = await resp.json()
        assert listing["default"] == "amy" and [v["name"] for v in listing["voices"]] == ["amy", "bob", "zed"], listing
        said = [line.split(": ", 1)[1] for line in srv.output().splitlines() if "service.default_voice: Default voice:" in line]
        assert said == ["Default voice: amy, the first by name of the 3 voices added together (--voice chooses another)"], said
        assert srv.alive()
    finally:
        stop_server(srv)
    assert "Traceback" not in srv.output()


@pytest.mark.parametrize(("given", "voice"), [("Auto", None), ("AUTO", None), ("auto", None), ("", None), (" Aria ", "Aria")])
def test_voice_auto_in_any_case_leaves_the_choice_to_the_server(given: str, voice: str | None) -> None:
    """The add-on writes ``voice: auto``; a user who types ``Auto`` must not be refused at
    start (``--voice 'Auto': neither a clone voice...``, the new-user trial): voice names
    match in any case, and so does ``auto``."""
    from wyoming_qwen3tts.__main__ import build_parser

    assert build_parser().parse_args(["--voice", given]).voice == voice


def test_an_unknown_default_voice_exits_before_any_model_loads(
    checkpoints: Path, voices_dir: Path, tmp_path: Path
) -> None:
    """``--voice nosuch`` without a CustomVoice model (whose speakers only its load tells):
    clones and presets are known before loading, so start-up ends at once, in one line
    naming a few valid voices."""
    models = ["--clone-model", str(checkpoints / "base"), "--design-model", str(checkpoints / "voice_design")]
    result = run_cli(
        "--data-dir", str(tmp_path), "--voices-dir", str(voices_dir), *models,
        "--custom-voice-model", "none", "--device", "cpu", "--engine", "reference", "--voice", "nosuch",
        cwd=tmp_path,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("--voice 'nosuch': neither a clone voice in ") and "valid voices: " in last, last
    assert "aria" in last and "clone" in last  # a preset and a clone of the voices folder
    assert "Loading" not in result.stderr and "Traceback" not in result.stderr


def test_an_unknown_default_voice_lists_the_valid_voices_as_the_server_lists_them(
    checkpoints: Path, voices_dir: Path, tmp_path: Path
) -> None:
    """``--voice nosuch``: start-up's list of valid voices was sorted by casefold, the first 8,
    and a clone ``Aria`` came beside the preset ``aria`` it takes the name of, while the
    running server's messages (``service.shown_names`` of the catalogue's voices) list them
    by name regardless of case, the first 12, each name once. Now start-up lists the same
    names in that order (capitals were first, as in "Aria, Bob, Zed, alina", until stop 48)."""
    from wyoming_qwen3tts.service.default_voice import shown_names
    from wyoming_qwen3tts.common.vocabulary import ModelKind
    from wyoming_qwen3tts.catalogue.voices import VoiceCatalog

    voices = tmp_path / "voices"
    voices.mkdir()
    for name in ("clone", "Aria", "Zed", "Bob"):
        (voices / f"{name}.wav").write_bytes((voices_dir / "clone.wav").read_bytes())
    result = run_cli(
        "--data-dir", str(tmp_path), "--voices-dir", str(voices), "--clone-model", str(checkpoints / "base"),
        "--design-model", str(checkpoints / "voice_design"), "--custom-voice-model", "none", "--device", "cpu",
        "--engine", "reference", "--voice", "nosuch", cwd=tmp_path,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    listed = "alina, Aria, beatriz, Bob, camille, clone, ember, giulia, haruto, james, lena, mateo, ... (16 in all)"
    assert last.endswith(f"; valid voices: {listed}"), last
    catalog = VoiceCatalog(voices, {ModelKind.BASE, ModelKind.VOICE_DESIGN})
    assert shown_names([v.name for v in catalog.voices()]) == listed
    assert "Loading" not in result.stderr and "Traceback" not in result.stderr


def test_a_default_voice_whose_clip_is_too_short_exits_before_any_model_loads(
    checkpoints: Path, voices_dir: Path, tmp_path: Path
) -> None:
    """``--voice tiny`` with ``tiny.wav`` 0.5 s long (under ``MIN_CLIP_SECONDS``): the check
    before loading took it (its header reads), the model loaded, and only then was it
    refused with the folder scan's reason. Now start-up ends at once with that reason."""
    from wyoming_qwen3tts.startup import check_default_voice
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    voices = tmp_path / "voices"
    voices.mkdir()
    for clip in voices_dir.glob("clone.*"):
        (voices / clip.name).write_bytes(clip.read_bytes())
    sf.write(voices / "tiny.wav", np.full(12000, 0.2, dtype=np.float32), 24000)  # 0.5 s
    result = run_clone_alone(tmp_path, voices, checkpoints, "--voice", "Tiny")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("--voice 'Tiny': a clone whose clip could not be used (tiny.wav: the clip is 0.50 s long, under "
                    "the 1 s a clone clip needs); replace the file in the voices folder; valid voices: clone"), last
    assert "Loading" not in result.stderr and "Traceback" not in result.stderr
    # A preset of the name is served all the same (the skipped clip shadows nothing).
    sf.write(voices / "aria.wav", np.full(12000, 0.2, dtype=np.float32), 24000)
    check_default_voice("aria", voices, {ModelKind.BASE, ModelKind.VOICE_DESIGN})


def test_a_default_voice_whose_clip_is_silent_or_whose_transcript_is_not_utf8_exits_before_any_model_loads(
    checkpoints: Path, voices_dir: Path, tmp_path: Path
) -> None:
    """The new-user trial: ``--voice quiet`` with ``quiet.wav`` 3 s of silence, and ``--voice
    lat`` with ``lat.txt`` saved as Windows-1252, passed the check before loading (it read
    headers only), the model loaded, and only then were they refused; ``valid voices``
    offered ``quiet``. Now the check reads clips and transcripts as the folder scan does:
    start-up ends at once with the scan's reason, and neither is offered."""
    from wyoming_qwen3tts.startup import check_default_voice
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    voices = tmp_path / "voices"
    voices.mkdir()
    for clip in voices_dir.glob("clone.*"):
        (voices / clip.name).write_bytes(clip.read_bytes())
    sf.write(voices / "quiet.wav", np.zeros(3 * 24000, dtype=np.float32), 24000)
    (voices / "quiet.txt").write_text("Nothing to hear.")
    (voices / "lat.wav").write_bytes((voices / "clone.wav").read_bytes())
    (voices / "lat.txt").write_bytes("Caf\u00e9 au lait.".encode("cp1252"))
    result = run_clone_alone(tmp_path, voices, checkpoints, "--voice", "quiet")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("--voice 'quiet': a clone whose clip could not be used (quiet.wav: the clip is silent: only 0.00 s "
                    "of it is louder than -43 dBFS, under the 0.1 s a clone clip needs); replace the file in the "
                    "voices folder; valid voices: clone"), last
    assert "Loading" not in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(SystemExit) as refused:
        check_default_voice("LAT", voices, {ModelKind.BASE})
    assert str(refused.value) == (  # the transcript named as the fault, as the catalogue names it (not the clip)
        "--voice 'LAT': a clone whose transcript could not be used (lat.wav: its transcript lat.txt is not UTF-8 text, "
        "it was saved in another encoding; save it as UTF-8); valid voices: clone")
    (voices / "lat.txt").write_text("Caf\u00e9 au lait.", encoding="utf-16")  # Notepad's "Unicode": read
    check_default_voice("lat", voices, {ModelKind.BASE})


def test_the_clone_model_alone_with_only_a_silent_clip_stops_before_loading(checkpoints: Path, tmp_path: Path) -> None:
    """The new-user trial: a voices folder whose only clip is silent, the clone model alone and
    no studio (``--http-port 0``): the model loaded, then "No voices". Now that stop comes
    before any model loads, naming the clip and the folder scan's reason."""
    from wyoming_qwen3tts.startup import survey_clips

    voices = tmp_path / "voices"
    voices.mkdir()
    sf.write(voices / "solo.wav", np.zeros(3 * 24000, dtype=np.float32), 24000)
    (voices / "solo.txt").write_text("Nothing to hear.")
    result = run_clone_alone(tmp_path, voices, checkpoints, "--http-port", "0")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (f"No voices: add a clone voice (<id>.wav and its transcript <id>.txt) to {voices}, or enable "
                    "the VoiceDesign model (--design-model) or the CustomVoice model (--custom-voice-model); "
                    "skipped: solo.wav (the clip is silent: only 0.00 s of it is louder than -43 dBFS, under the "
                    "0.1 s a clone clip needs)"), last
    assert "Loading" not in result.stderr and "Traceback" not in result.stderr
    (voices / "solo.txt").write_bytes(b"\xff\xfeN")  # UTF-16 cut short: skipped too, the transcript named
    sf.write(voices / "solo.wav", np.full(3 * 24000, 0.2, dtype=np.float32) * np.sin(np.arange(3 * 24000)), 24000)
    assert survey_clips(voices) == (False, ["solo.wav (its transcript solo.txt starts as UTF-16 text but is cut short "
                                            "or broken; save it as UTF-8)"])


def test_the_check_before_loading_lets_the_clone_model_alone_start_with_no_clip_only_with_the_studio(tmp_path: Path) -> None:
    """``check_some_voice``: the Base model alone with no clip whose header reads is refused
    before loading without the studio, and let through with it (its first clip comes from
    there); other models always have voices."""
    from wyoming_qwen3tts.startup import check_some_voice
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    (tmp_path / "broken.wav").write_bytes(b"RIFF....not a wav file")
    with pytest.raises(SystemExit, match=r"^No voices: .*; skipped: broken.wav \(the file could not be decoded as audio: Format not "
                                            r"recognised\)$"):
        check_some_voice(tmp_path, {ModelKind.BASE})
    check_some_voice(tmp_path, {ModelKind.BASE}, studio=True)
    check_some_voice(tmp_path / "missing", {ModelKind.BASE}, studio=True)
    check_some_voice(tmp_path, {ModelKind.BASE, ModelKind.VOICE_DESIGN})


def test_an_unknown_default_voice_with_no_clip_is_refused_even_with_the_studio(checkpoints: Path, tmp_path: Path) -> None:
    """The clone model alone and an empty voices folder start (their studio takes the first
    clip), but not with a ``--voice`` naming a voice that is not there: that stays refused
    at once, before any model loads."""
    from .conftest import free_port

    voices = tmp_path / "voices"
    voices.mkdir()
    result = run_clone_alone(tmp_path, voices, checkpoints, "--http-host", "127.0.0.1", "--http-port", str(free_port()), "--voice", "nosuch")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("--voice 'nosuch': neither a clone voice in ") and last.endswith("valid voices: none"), last
    assert "Loading" not in result.stderr and "Traceback" not in result.stderr


def test_default_voice_check_knows_clones_presets_and_leaves_speakers_to_the_model(
    voices_dir: Path, tmp_path: Path
) -> None:
    from wyoming_qwen3tts.startup import check_default_voice
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    base, design, custom = ModelKind.BASE, ModelKind.VOICE_DESIGN, ModelKind.CUSTOM_VOICE
    for name, kinds in (
        ("Clone", {base}),  # a clone, any case
        ("aria", {design}),  # a shipped preset
        ("ARIA", {base, design}),
        ("ryan", {base, custom}),  # could be a CustomVoice speaker: the loaded model decides
        ("nosuch", {custom}),
        (None, {base}),  # no --voice: the server chooses
    ):
        check_default_voice(name, voices_dir, kinds)
    (tmp_path / "presets.toml").write_text('[mine]\ninstruct = "A calm voice."\nlanguage = "en"\naliases = ["my-voice"]\n')
    check_default_voice("my-voice", tmp_path, {design})  # a user preset's alias
    with pytest.raises(SystemExit, match=r"the preset 'aria' needs the VoiceDesign model"):
        check_default_voice("aria", voices_dir, {base})
    with pytest.raises(SystemExit, match=r"neither a clone voice .* valid voices: clone, xvec"):
        check_default_voice("nosuch", voices_dir, {base})
    with pytest.raises(SystemExit, match=r"\(no such folder\)"):
        check_default_voice("nosuch", tmp_path / "typo", {base})


def test_default_voice_check_reads_custom_voice_speakers_from_the_checkpoint(
    checkpoints: Path, voices_dir: Path, tmp_path: Path
) -> None:
    """The new-user trial: with a CustomVoice model enabled, ``--voice nosuch`` was found only
    after every model loaded. Its speakers are in the checkpoint's config.json."""
    from wyoming_qwen3tts.startup import check_default_voice, known_speakers
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    speakers = known_speakers(str(checkpoints / "custom_voice"), tmp_path)
    assert speakers is not None and "ryan" in speakers and len(speakers) >= 2
    assert known_speakers("Qwen/not-downloaded-here", tmp_path) is None  # the loaded model says
    kinds = {ModelKind.BASE, ModelKind.CUSTOM_VOICE}
    check_default_voice("Ryan", voices_dir, kinds, speakers)
    check_default_voice("clone", voices_dir, kinds, speakers)
    with pytest.raises(SystemExit, match=r"a preset nor a CustomVoice speaker; valid voices: .*ryan"):
        check_default_voice("nosuch", voices_dir, kinds, speakers)
    models = ["--clone-model", str(checkpoints / "base"), "--design-model", "none",
              "--custom-voice-model", str(checkpoints / "custom_voice")]
    result = run_cli(
        "--data-dir", str(tmp_path), "--voices-dir", str(voices_dir), *models,
        "--device", "cpu", "--engine", "reference", "--voice", "nosuch", cwd=tmp_path,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("--voice 'nosuch': neither a clone voice in ") and "ryan" in last, last
    assert "Loading" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("preset", [None, "elsewhere"])
def test_compiled_kernels_are_kept_in_the_data_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str | None
) -> None:
    """Triton's own cache manager puts compiled kernels under --data-dir (persistent in the
    add-on), unless the user set TRITON_CACHE_DIR."""
    pytest.importorskip("triton")
    from triton.runtime.cache import get_cache_manager

    from wyoming_qwen3tts.__main__ import _kernel_cache

    monkeypatch.setenv("TRITON_CACHE_DIR", "unset")  # records the value to restore after the test
    if preset is None:
        monkeypatch.delenv("TRITON_CACHE_DIR")
    else:
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / preset))
    _kernel_cache(tmp_path / "data")
    cache = Path(get_cache_manager("ab" * 32).cache_dir)
    expected = tmp_path / "data" / "cache" / "triton" if preset is None else tmp_path / preset
    assert cache.parent == expected.resolve()


def test_a_torchaudio_built_for_another_torch_is_named_in_the_load_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip pairs a newer torch with the newest torchaudio, which loads only beside its own
    torch: the start-up failure then says so and how to fix it; a failure that is not about
    torchaudio, or matching versions, get no such hint."""
    import importlib.metadata

    from wyoming_qwen3tts.startup import _load_failure, torchaudio_mismatch
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    versions = {"torch": "2.13.0", "torchaudio": "2.11.1"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: versions[name])
    broken = OSError("Could not load this library: /v/lib/python3.11/site-packages/torchaudio/lib/_torchaudio.so")
    message = _load_failure(ModelKind.BASE, "./tiny/base", broken)
    assert message.startswith("Cannot load the base model './tiny/base': Could not load this library")
    assert "torchaudio 2.11.1 is built for torch 2.11, but torch 2.13.0 is installed" in message
    assert "pip install 'torchaudio==2.13.*'" in message
    assert "torchaudio 2.11.1" not in _load_failure(ModelKind.BASE, "x", OSError("disk full"))
    versions["torchaudio"] = "2.13.0+cpu"
    assert torchaudio_mismatch() is None
    assert _load_failure(ModelKind.BASE, "x", broken) == f"Cannot load the base model 'x': {broken}"


def test_the_clone_model_alone_with_no_clip_and_no_studio_stops_before_loading(checkpoints: Path, tmp_path: Path) -> None:
    """Base model only, the HTTP port and with it the voice studio off (``--http-port 0``),
    and a voices folder with no usable clip (a transcript, a broken file, a clip whose
    name holds a tab, a 0.5 s one and one cut off short of its header's 3 s, each named): no voice could ever be added through the server, and a
    headless server with none is most likely pointed at the wrong folder, so start-up ends
    at once, before any model loads (a download of several GB for a real one), naming the
    folder and the three ways out. With the studio the server starts and serves it
    (``tests/test_studio.py``, ``test_the_clone_model_alone_with_no_clip_starts...``)."""
    voices = tmp_path / "voices"
    voices.mkdir()
    (voices / "later.txt").write_text("A transcript, its clip not copied yet.")
    (voices / "broken.wav").write_bytes(b"RIFF....not a wav file")
    sf.write(voices / "tab\there.wav", np.full(24000, 0.2, dtype=np.float32), 24000)  # skipped by the catalogue
    sf.write(voices / "short.wav", np.full(12000, 0.2, dtype=np.float32), 24000)  # 0.5 s: under MIN_CLIP_SECONDS
    sf.write(voices / "cut.wav", np.full(72000, 0.2, dtype=np.float32), 24000)  # 3 s, then cut off after 0.04 s
    (voices / "cut.wav").write_bytes((voices / "cut.wav").read_bytes()[:2000])
    result = run_clone_alone(tmp_path, voices, checkpoints, "--http-port", "0")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (f"No voices: add a clone voice (<id>.wav and its transcript <id>.txt) to {voices}, or enable "
                    "the VoiceDesign model (--design-model) or the CustomVoice model (--custom-voice-model); "
                    "skipped: broken.wav (the file could not be decoded as audio: Format not recognised), cut.wav (the "
                    "clip holds 0.04 s of audio though its header says 3.00 s: the file looks cut off, an incomplete "
                    "download or copy), short.wav "
                    "(0.50 s long, under the 1 s a clone clip needs), 'tab\\there.wav' (control characters in its name)"), last
    assert "Loading" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("engine", ["reference", "ggml"])
def test_a_mistyped_clone_model_path_with_no_clip_is_named_before_no_voices(tmp_path: Path, engine: str) -> None:
    """``--clone-model tny/base`` (a typo of the folder ``tiny/base``) and an empty voices
    folder: start-up stopped at "No voices", and the model's "no folder ... exists either"
    came only after a clip was added. Now one line names the model first, then no voices,
    still before anything loads or is fetched."""
    voices = tmp_path / "voices"
    voices.mkdir()
    result = run_cli(
        "--data-dir", str(tmp_path), "--voices-dir", str(voices), "--clone-model", "tny/base",
        "--design-model", "none", "--custom-voice-model", "none", "--device", "cpu", "--engine", engine, cwd=tmp_path,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"--clone-model 'tny/base': no model of that hub id is downloaded yet; no folder "
                           f"{tmp_path / 'tny' / 'base'} exists either. No voices: add a clone voice "), last
    assert "Loading" not in result.stderr and "Fetching" not in result.stderr and "Traceback" not in result.stderr


def test_the_no_voices_stop_names_only_a_model_plainly_wrong(tmp_path: Path) -> None:
    """``unfound_model`` in ``check_some_voice``: a released model not downloaded yet, a hub
    model already downloaded and an existing folder are not named; a path that is no folder is."""
    from wyoming_qwen3tts.startup import check_some_voice
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    models = tmp_path / "models"
    snapshot = models / "models--someone--finetune" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (models / "models--someone--finetune" / "refs").mkdir()
    (models / "models--someone--finetune" / "refs" / "main").write_text("0" * 40)
    (tmp_path / "folder").mkdir()
    for source in ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "someone/finetune", str(tmp_path / "folder")):
        with pytest.raises(SystemExit, match=r"^No voices: "):
            check_some_voice(tmp_path / "voices", {ModelKind.BASE}, clone_model=source, models_dir=models)
    with pytest.raises(SystemExit, match=r"^--clone-model './nope': the model folder does not exist .*\. No voices: "):
        check_some_voice(tmp_path / "voices", {ModelKind.BASE}, clone_model="./nope", models_dir=models)


def test_default_voice_check_and_clip_survey_know_clips_named_with_spaces_or_decomposed_accents(tmp_path: Path) -> None:
    """Before loading, ``--voice`` is checked against the voice names the catalogue gives the
    clips: ``"trail .wav"`` is ``trail`` (its spaces are not part of the name), an NFD
    ``Renée.wav`` is ``Renée`` in either spelling; ``" .wav"`` has a blank name and is skipped."""
    from wyoming_qwen3tts.startup import check_default_voice, survey_clips
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    tone = (0.3 * np.sin(2 * np.pi * 200 * np.arange(24000) / 24000)).astype(np.float32)
    for stem in ("trail ", "Rene\u0301e", " "):
        sf.write(tmp_path / f"{stem}.wav", tone, 24000)
    for name in ("trail", "trail ", "TRAIL", "Ren\u00e9e", "Rene\u0301e"):
        check_default_voice(name, tmp_path, {ModelKind.BASE})
    with pytest.raises(SystemExit, match="valid voices: Ren\u00e9e, trail$"):
        check_default_voice("nosuch", tmp_path, {ModelKind.BASE})
    assert survey_clips(tmp_path) == (True, ["' .wav' (a blank name)"])


@pytest.mark.full
async def test_a_clone_only_server_starts_with_a_clip_named_with_a_trailing_space(checkpoints: Path, tmp_path: Path) -> None:
    """The new-user trial: with ``"Amy .wav"`` and ``bob.wav`` and the clone model alone, the
    server exited at start (``--voice: Unknown voice 'Amy '``, no ``--voice`` given): the
    default voice, first by name, was listed as ``"Amy "`` and looked up stripped. The voice
    is ``Amy``: the real process starts, lists and describes it so, makes it the default,
    and speaks it when asked for by that name, with the space, or by no name, on both doors."""
    import json
    import urllib.request

    from .conftest import start_server, stop_server
    from .test_studio import wyoming_samples, wyoming_voices

    voices = tmp_path / "voices"
    voices.mkdir()
    t = np.arange(2 * 24000) / 24000
    sf.write(voices / "Amy .wav", (0.3 * np.sin(2 * np.pi * 190 * t)).astype(np.float32), 24000)
    (voices / "Amy .txt").write_text("Hello, this is Amy.")
    sf.write(voices / "bob.wav", (0.3 * np.sin(2 * np.pi * 120 * t)).astype(np.float32), 24000)
    srv = start_server(
        checkpoints, voices, tmp_path / "server.log",
        extra=["--no-zeroconf", "--design-model", "none", "--custom-voice-model", "none"],
    )
    try:
        with urllib.request.urlopen(srv.http_url + "/v1/audio/voices", timeout=60) as resp:
            listing = json.loads(resp.read())
        assert listing["default"] == "Amy" and [v["name"] for v in listing["voices"]] == ["Amy", "bob"], listing
        for voice in ("Amy", "Amy ", None):
            body = {"input": "Hi", "model": "qwen3-tts-clone", "response_format": "pcm"}
            if voice is not None:
                body["voice"] = voice
            request = urllib.request.Request(
                srv.http_url + "/v1/audio/speech", data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=300) as resp:
                assert resp.status == 200 and resp.headers["X-Voice"] == "Amy" and len(resp.read()) > 0, voice
        assert await wyoming_voices(srv) == {"Amy", "bob"}
        assert await wyoming_samples(srv, "Amy ", "Hi") > 0
        assert srv.alive()
    finally:
        stop_server(srv)
    assert "Traceback" not in srv.output()


def test_the_cpu_engine_line_says_which_models_run_on_qwentts_cpp_and_which_fell_back() -> None:
    from wyoming_qwen3tts.startup import cpu_engines_line
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    base, custom, design = ModelKind.BASE, ModelKind.CUSTOM_VOICE, ModelKind.VOICE_DESIGN
    assert cpu_engines_line("No CUDA GPU", [base, custom], []) == (
        "No CUDA GPU: running on the CPU, every model on qwentts.cpp (GGML, quantized weights)"
    )
    assert cpu_engines_line("--device cpu", [base], [custom, design]) == (
        "--device cpu: running on the CPU, the base model on qwentts.cpp (GGML, quantized weights); the "
        "custom_voice and voice_design models fell back to the reference engine (qwen_tts, slower) (said above, with why)"
    )
    assert cpu_engines_line("--device cpu", [], [base]) == (
        "--device cpu: running on the CPU; every model fell back to the reference engine (qwen_tts, slower), as "
        "qwentts.cpp cannot run its checkpoint (each said above, with why)"
    )
    assert cpu_engines_line("--device cpu", [custom], [base], "pipeline") == (
        "--device cpu: running on the CPU, the custom_voice model on the pipeline engine (our ggml graphs generating, "
        "the codec on ONNX Runtime on its own threads); the base model fell back to the reference engine (qwen_tts, "
        "slower) (said above, with why)"
    )
    assert cpu_engines_line("No CUDA GPU", [custom], [], "pipeline").startswith(
        "No CUDA GPU: running on the CPU (our ggml graphs generating on one thread, the codec on ONNX Runtime on another)"
    )


async def test_a_cpu_start_whose_every_model_fell_back_says_so(
    checkpoints: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--device cpu --engine auto`` with qwentts.cpp available, and a Base checkpoint it
    cannot run (the tiny one, narrower than the release): the model loads on the reference
    engine, and the start-up's engine line, said once the models are loaded, says every
    model fell back to it (it said, before loading, that qwentts.cpp ran "each model it can
    run", which was none). The pipeline engine is made unavailable (``auto`` picks it first
    where it runs; its own fallback: ``test_ggml.test_named_models_on_the_cpu_...``)."""
    import logging

    from wyoming_qwen3tts.__main__ import build_parser
    from wyoming_qwen3tts.engine import loader
    from wyoming_qwen3tts.engine.cpu import pipeline_load
    from wyoming_qwen3tts.engine.cpu.ggml import native_support
    from wyoming_qwen3tts.common.metrics import Metrics
    from wyoming_qwen3tts.startup import load_engines
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    supported, why = native_support()
    if not supported:
        pytest.skip(f"GGML engine unavailable: {why}")
    voices = tmp_path / "voices"
    voices.mkdir()
    sf.write(voices / "clone.wav", (0.2 * np.sin(2 * np.pi * 180 * np.arange(24000 * 2) / 24000)).astype(np.float32), 24000)
    argv = [
        "--data-dir", str(tmp_path), "--voices-dir", str(voices), "--local-files-only", "--clone-model",
        str(checkpoints / "base"), "--design-model", "none", "--custom-voice-model", "none", "--device", "cpu",
        "--engine", "auto",
    ]
    args = build_parser().parse_args(argv)
    args.given = {a for a in argv if a.startswith("--")}
    monkeypatch.setattr(pipeline_load, "pipeline_support", lambda: (False, "test: no pipeline"))
    picks = (loader._auto_engine, loader._pipeline_engine, loader._wheel_or_reference)
    for cached in picks:
        cached.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="wyoming_qwen3tts"):
            engines = await load_engines(args, Metrics())
    finally:
        for cached in picks:
            cached.cache_clear()
    assert list(engines) == [ModelKind.BASE] and "GGML" not in engines[ModelKind.BASE].backend
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if "running on the CPU" in m] == [
        "--device cpu: running on the CPU; every model fell back to the reference engine (qwen_tts, slower), as "
        "qwentts.cpp cannot run its checkpoint (each said above, with why)"
    ], said
    assert not [m for m in said if "qwentts.cpp (GGML" in m or "each model it can run" in m], said
    why_line = next(i for i, m in enumerate(said) if m.startswith("The base model runs on the reference engine (slower), not on GGML: "))
    assert why_line < next(i for i, m in enumerate(said) if "running on the CPU" in m)  # "said above"


@pytest.mark.full
async def test_a_real_server_reads_notepad_transcripts_and_mp3_clips_and_says_which_file_to_fix(
    checkpoints: Path, voices_dir: Path, tmp_path: Path
) -> None:
    """The new-user trial's voices folder, end to end on the real process and its HTTP door:
    a UTF-16 transcript (Notepad's "Unicode") and an MP3 clip with its transcript are voices
    and speak; a Windows-1252 transcript and a constant-offset "clip" are listed under
    ``skipped`` with reasons naming the transcript / saying silent, a request for the first
    is refused naming its transcript, and nothing is logged at ERROR (the transcript was an
    ERROR blaming the clip; the MP3 was "no clip beside it"; the offset clip was a voice).
    ``--voice kim`` with a silent ``kim.mp3`` beside a good ``kim.wav``: the check before
    loading judged the first by file name, ``kim.mp3``, and stopped start-up, though the
    catalogue speaks ``kim.wav`` (lossless first: ``voices.clip_preference``). It starts."""
    import json
    import urllib.error
    import urllib.request

    from .conftest import start_server, stop_server

    voices = tmp_path / "voices"
    voices.mkdir()
    clip = (voices_dir / "clone.wav").read_bytes()
    (voices / "u16.wav").write_bytes(clip)
    (voices / "u16.txt").write_text("Caf\u00e9 au lait.", encoding="utf-16")
    (voices / "lat.wav").write_bytes(clip)
    (voices / "lat.txt").write_bytes("Caf\u00e9 au lait.".encode("cp1252"))
    audio, rate = sf.read(voices_dir / "clone.wav", dtype="float32")
    sf.write(voices / "grandma.mp3", audio, rate, format="MP3")
    (voices / "grandma.txt").write_text("Hello, it is Grandma.")
    sf.write(voices / "dc.wav", np.full(3 * 24000, 0.5, np.float32), 24000)
    (voices / "kim.wav").write_bytes(clip)
    sf.write(voices / "kim.mp3", np.zeros(3 * 24000, np.float32), 24000, format="MP3")  # silent
    srv = start_server(
        checkpoints, voices, tmp_path / "server.log",
        extra=["--no-zeroconf", "--design-model", "none", "--custom-voice-model", "none", "--voice", "kim"],
    )
    try:
        with urllib.request.urlopen(srv.http_url + "/v1/audio/voices", timeout=60) as resp:
            listing = json.loads(resp.read())
        assert sorted(v["name"] for v in listing["voices"]) == ["grandma", "kim", "u16"], listing
        assert listing["default"] == "kim" and listing["default_served"], listing
        skipped = {s["file"]: s["reason"] for s in listing["skipped"]}
        assert skipped == {
            "dc.wav": "the clip is silent: only 0.00 s of it is louder than -43 dBFS, under the 0.1 s a clone clip needs",
            "lat.wav": "its transcript lat.txt is not UTF-8 text, it was saved in another encoding; save it as UTF-8",
            "kim.mp3": "kim.wav gives the same voice name and is used instead (lossless .wav is preferred to lossy "
                       ".mp3); rename or remove this file",
        }, skipped
        for voice, status in (("grandma", 200), ("u16", 200), ("lat", 404)):
            body = {"input": "Hi", "model": "qwen3-tts-clone", "response_format": "pcm", "voice": voice}
            request = urllib.request.Request(
                srv.http_url + "/v1/audio/speech", data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=300) as resp:
                    assert resp.status == status and len(resp.read()) > 0, voice
            except urllib.error.HTTPError as err:
                message = json.loads(err.read())["error"]["message"]
                assert err.code == status and "lat.txt is not UTF-8 text" in message, (voice, message)
        assert srv.alive()
    finally:
        stop_server(srv)
    log = srv.output()
    assert " ERROR " not in log and "Traceback" not in log, log[-3000:]
    assert "no clip beside it" not in log and "lat.txt is not UTF-8 text" in log
