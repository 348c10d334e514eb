"""The text front end: an LLM's markdown reply in, speakable segments out.

``markdown`` reads markdown (with ``markup``: HTML and SSML) into speech text, ``segmenter``
cuts it into segments the engine speaks, ``writing`` holds the characters both decide by,
``languages`` the BCP-47 codes and Qwen3-TTS language names.

It imports only ``common``.
"""
