"""The speech service every door calls: one request type in, one PCM stream out.

``speech`` (``TtsService``, ``SpeechStream``) checks a request, resolves its voice and feeds
the engines through ``scheduler`` (clients take turns at segment boundaries);
``default_voice`` keeps the voice of requests that name none; ``readiness`` admits requests
up to the queue's limit, says whether the server is ready and drains it; ``errors`` holds
the refusals and failures every door reports; ``backends`` names the engines in words.
``anchors`` renders each VoiceDesign preset once so it is cloned afterwards; ``clips``
prepares clone clips before they are asked for.

It imports the engine, the catalogue, ``text`` and ``common``; never a door.
"""
