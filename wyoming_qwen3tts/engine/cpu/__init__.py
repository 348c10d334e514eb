"""The CPU engines: qwentts.cpp through GGML (``ggml``, its GGUF files in ``gguf_files``),
qwen_tts's reference model (``reference``), and what the server loads by default on a
machine without CUDA (``defaults``). ``native``: generation graphs of our own on the ggml
the qwentts.cpp wheel bundles, each frame's codes out to Python (issue 50).
"""
