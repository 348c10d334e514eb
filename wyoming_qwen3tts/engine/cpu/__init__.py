"""The CPU engines: qwentts.cpp through GGML (``ggml``, its GGUF files in ``gguf_files``),
qwen_tts's reference model (``reference``), the pipeline engine (``pipeline``: codec frames
from a ``FrameSource``, ``native.GgmlFrameSource``, decoded by ONNX Runtime's streaming step,
``onnx_codec`` / ``onnx_export``, on their own threads; built by ``pipeline_load``), the
settings each takes from the machine (``machine``), and what the server loads by default on
a machine without CUDA (``defaults``). ``native``: generation graphs of our own on the ggml
the qwentts.cpp wheel bundles, each frame's codes out to Python (issue 50).
"""
