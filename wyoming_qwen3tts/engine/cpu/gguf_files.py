"""Where the GGML engine's two GGUF files (talker, codec) come from.

A model source (``--clone-model`` etc.) is one of:

* a folder holding one ``*talker*.gguf`` and one ``*tokenizer*.gguf`` (or ``*codec*.gguf``):
  used as it is;
* a Hugging Face checkpoint folder (``config.json`` + safetensors): converted once with
  ``wyoming_qwen3tts.gguf`` into ``DATA_DIR/models/gguf/<folder name>-<hash>/`` at the chosen
  quantization (``Q4_K_M`` cannot be made locally and falls back to ``Q8_0``, with a warning);
* a released model id (``Qwen/Qwen3-TTS-12Hz-0.6B-Base`` ...): the published files of
  ``GGUF_REPO`` are fetched through ``huggingface_hub`` into ``DATA_DIR/models`` (its
  progress bars in the log; ``local_files_only`` never downloads).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

_LOGGER = logging.getLogger(__name__)


def hub_error(err: BaseException) -> str:
    """A Hugging Face hub error in the server's terms: its first line, without the hub's
    advice to set the Python argument ``local_files_only`` (the server's flag is
    ``--local-files-only``, named in the message around it)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    cut = text.find("To enable hf.co look-ups")
    return (text[:cut].rstrip(" .") + ".") if cut > 0 else text


def with_folder_note(message: str, source: str) -> str:
    """``message`` (that ``source`` is no model the server can get), with
    "; no folder <absolute path> exists either" after it when ``source`` may be a relative
    folder path (it holds "/" and no ":"): a model option takes a folder or a hub id, and
    "tiny/base" may be either, so a mistyped folder without "./" was reported only as an
    unknown id. The path is resolved against the working folder."""
    if "/" not in source or ":" in source:
        return message
    return f"{message.rstrip('. ')}; no folder {Path(source).expanduser().absolute()} exists either"


#: The published GGUF conversions (the repository realtimetts-qwen-native-cpu 0.4.2 names).
GGUF_REPO = "Serveurperso/Qwen3-TTS-GGUF"
#: Quantizations: the published files' (BF16, Q8_0, Q4_K_M; the converter makes all but
#: Q4_K_M) and Q4_0, made by the converter only (4-bit generation weights, Q8_0 codec).
QUANTS = ("BF16", "Q8_0", "Q4_K_M", "Q4_0")
#: Made from a checkpoint folder only: not among the published files.
CONVERTED_ONLY = ("Q4_0",)
DEFAULT_QUANT = "Q8_0"
#: Released model id -> stem of its talker file in ``GGUF_REPO`` (the binding's own table).
_TALKER_STEMS = {
    "Qwen/Qwen3-TTS-12Hz-0.6B-Base": "qwen-talker-0.6b-base",
    "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice": "qwen-talker-0.6b-customvoice",
    "Qwen/Qwen3-TTS-12Hz-1.7B-Base": "qwen-talker-1.7b-base",
    "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice": "qwen-talker-1.7b-customvoice",
    "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign": "qwen-talker-1.7b-voicedesign",
}


def find_pair(folder: Path) -> tuple[Path, Path] | None:
    """(talker, codec) GGUF files in ``folder``, or None if it holds none.

    Raises:
        FileNotFoundError: GGUF files are there but not exactly one talker and one codec.
    """
    files = sorted(folder.glob("*.gguf"))
    if not files:
        return None
    talkers = [f for f in files if "talker" in f.name]
    codecs = [f for f in files if f not in talkers and ("tokenizer" in f.name or "codec" in f.name)]
    if len(talkers) != 1 or len(codecs) != 1:
        raise FileNotFoundError(
            f"{folder} must hold one *talker*.gguf and one *tokenizer*.gguf (or *codec*.gguf); "
            f"found {', '.join(f.name for f in files)}"
        )
    return talkers[0], codecs[0]


def resolve_gguf(source: str, models_dir: Path, quant: str, local_files_only: bool) -> tuple[Path, Path]:
    """The (talker, codec) GGUF files for a model source (see the module docstring).

    Raises:
        FileNotFoundError: a missing folder, a model id that has no published GGUF, a
            download failure or a file not downloaded under ``local_files_only``.
        ValueError: an unknown quantization.
    """
    quant = quant.upper()
    if quant not in QUANTS:
        raise ValueError(f"unknown GGUF quantization {quant!r}; one of {', '.join(QUANTS)}")
    path = Path(source).expanduser()
    if path.is_dir():
        pair = find_pair(path)
        if pair is not None:
            return pair
        if (path / "config.json").is_file():
            return _converted(path, models_dir, quant)
        raise FileNotFoundError(f"{path} holds neither GGUF files nor a Hugging Face checkpoint")
    if source.startswith(("/", ".", "~")) or path.exists():
        raise FileNotFoundError(f"Model folder {source!r} does not exist (or is not a folder)")
    return _download(source, models_dir, quant, local_files_only)


def _converted(checkpoint: Path, models_dir: Path, quant: str) -> tuple[Path, Path]:
    """Convert ``checkpoint`` once into a cache folder keyed by its config and weights' sizes.

    The converter runs in a child process (``python -m wyoming_qwen3tts.gguf``): it reads the
    safetensors through torch, which would otherwise stay imported (0.5 GB resident) in the
    server that then serves on the GGML engine, as would the converter's peak memory.

    Raises:
        ValueError: the converter failed (its last error line).
    """
    import subprocess
    import sys

    if quant == "Q4_K_M":
        _LOGGER.warning("Q4_K_M cannot be made from a checkpoint here (only downloaded); converting to Q8_0")
        quant = "Q8_0"
    stamp = json.dumps(
        [sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in checkpoint.rglob("*.safetensors")), quant]
    )
    out = models_dir / "gguf" / f"{checkpoint.name}-{hashlib.sha256(stamp.encode()).hexdigest()[:12]}"
    done = out / ".complete"
    if done.exists():
        pair = find_pair(out)
        if pair is not None:
            return pair
    _LOGGER.info("Converting %s to GGUF (%s) into %s", checkpoint, quant, out)
    result = subprocess.run(
        [sys.executable, "-m", "wyoming_qwen3tts.gguf", str(checkpoint), str(out), "--quant", quant],
        capture_output=True, text=True, check=False,
    )
    pair = find_pair(out)
    if result.returncode != 0 or pair is None:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise ValueError(f"converting {checkpoint} to GGUF failed: {lines[-1] if lines else f'exit {result.returncode}'}")
    done.write_text("ok\n")
    return pair


def _download(model_id: str, models_dir: Path, quant: str, local_files_only: bool) -> tuple[Path, Path]:
    """The published files of ``model_id`` through ``huggingface_hub`` (cached in ``models_dir``)."""
    stem = _TALKER_STEMS.get(model_id)
    if quant in CONVERTED_ONLY:
        raise FileNotFoundError(
            with_folder_note(f"{quant} is not published for {model_id!r}: it is made from a checkpoint "
                             "folder (give one), or use the published 4-bit Q4_K_M", model_id)
        )
    if stem is None:
        raise FileNotFoundError(with_folder_note(
            f"No published GGUF for {model_id!r} (known: {', '.join(sorted(_TALKER_STEMS))}); "
            "give a checkpoint folder to convert, or a folder of GGUF files", model_id
        ))
    from huggingface_hub import hf_hub_download

    names = (f"{stem}-{quant}.gguf", f"qwen-tokenizer-12hz-{quant}.gguf")
    try:
        _LOGGER.info("%s %s from %s in %s", "Looking for" if local_files_only else "Fetching",
                     " and ".join(names), GGUF_REPO, models_dir)
        talker, codec = (
            Path(hf_hub_download(GGUF_REPO, name, cache_dir=str(models_dir), local_files_only=local_files_only))
            for name in names
        )
    except Exception as err:  # noqa: BLE001 - hub errors are many types; all mean "no weights"
        hint = " (--local-files-only is set: start once without it to download, or give a folder)" if local_files_only else ""
        raise FileNotFoundError(
            with_folder_note(f"Cannot get the GGUF files of {model_id!r}{hint}: {hub_error(err)}", model_id)
        ) from err
    return talker, codec


def gguf_identity(pair: tuple[Path, Path], models_dir: Path) -> Path:
    """A folder standing for a GGUF model where a checkpoint folder is expected by identity
    (``anchors.model_identity`` hashes ``config.json``): its ``config.json`` names the two
    files with their sizes, so the identity changes exactly when the weights do.

    Raises:
        FileNotFoundError: a file of ``pair`` is gone.
    """
    entries = [{"name": p.name, "bytes": p.stat().st_size} for p in pair]
    text = json.dumps({"gguf": entries}, sort_keys=True)
    folder = models_dir / "gguf-identity" / hashlib.sha256(text.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(text + "\n")
    return folder
