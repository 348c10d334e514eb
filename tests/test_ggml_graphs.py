"""Our own generation graphs on the ggml that the qwentts.cpp wheel bundles
(``engine.cpu.native``): the ctypes declarations checked at load, and greedy codes equal to
the float32 lean modules (``testing.lean``) for every voice kind on the ``--size ggml``
checkpoints."""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import pytest

from wyoming_qwen3tts.engine.cpu.native import api


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


def test_a_missing_library_is_refused(tmp_path: Path) -> None:
    with pytest.raises(api.GgmlApiError, match="does not load"):
        api.load_from(tmp_path / "libggml-base.so.0", tmp_path / "libggml-cpu.so.0")
