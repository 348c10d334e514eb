"""The speech service every door calls: one request type in, one PCM stream out.

``speech`` (``TtsService``) checks a request, resolves its voice and feeds the engines
through ``scheduler`` (clients take turns at segment boundaries); ``anchors`` renders each
VoiceDesign preset once so it is cloned afterwards; ``clips`` prepares clone clips before
they are asked for.

It imports the engine, the catalogue, ``text`` and ``common``; never a door.
"""
