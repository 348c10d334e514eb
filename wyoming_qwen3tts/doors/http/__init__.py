"""The HTTP door (aiohttp): ``api`` builds the app and serves ``POST /v1/audio/speech``
(parsed by ``request``, encoded by ``encoders``, its speed changed by ``tempo``);
``websocket`` streams text in and PCM out (its events in ``ws_events``); ``studio`` is the
voice studio (its page in ``web/``); ``openapi`` describes it all; ``shared`` holds what the
routes share."""
