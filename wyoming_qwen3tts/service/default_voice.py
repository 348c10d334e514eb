"""The default voice: the voice of requests that name none.

An explicit default (``--voice``) is pinned: kept as given, refused with
``DefaultVoiceGoneError`` while its clip is gone from the voices folder, and the studio may
not remove it. An automatic one follows ``pick_default_voice`` among the voices that can be
spoken, picked anew (and logged once) when its voice goes. ``DefaultVoice`` holds that
state for the service (``TtsService.default_voice``); the helpers here also name voices in
messages (``shown_names``) for the start-up checks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..catalogue.voices import Voice, VoiceCatalog, name_order

_LOGGER = logging.getLogger(__name__)

#: Voice used when a request names none and ``--voice`` names none either, if the catalogue
#: has it and it can be spoken (else the first such voice by name: ``pick_default_voice``,
#: ``TtsService.default_voice``).
DEFAULT_VOICE = "aria"


class DefaultVoice:
    """The voice of requests that name none, as the service's catalogue changes.

    Args:
        catalog: the voice catalogue (read, never refreshed here: the doors refresh it).
        name: the default voice at start (None: none yet).
        explicit: ``name`` was chosen by the user (``--voice``): it is pinned. False: it was
            picked by ``pick_default_voice`` (or is None) and is picked again when its voice
            is gone (``name``).
        unspeakable: why a voice cannot be spoken on this server, or None when it can
            (``TtsService.unspeakable``).
        studio: where clients find the voice studio (its URL, in words), for the advice of
            ``gone_message``; None: no studio.
    """

    def __init__(
        self,
        catalog: VoiceCatalog,
        name: str | None,
        explicit: bool,
        unspeakable: Callable[[Voice], str | None],
        studio: str | None = None,
    ) -> None:
        self._catalog = catalog
        self._name = name
        self.explicit = explicit and name is not None
        self._unspeakable = unspeakable
        self._studio = studio
        self._pinned_gone = False  # the explicit default is no longer served (logged once)
        self._pinned_mute_said = False  # the explicit default cannot be spoken on this GPU (logged once)

    def _speakable(self) -> list[Voice]:
        return [voice for voice in self._catalog.voices() if self._unspeakable(voice) is None]

    @property
    def gone(self) -> bool:
        """True while the explicit default is no longer served (as ``served`` last found)."""
        return self.explicit and self._pinned_gone

    @property
    def name(self) -> str | None:
        """The voice of requests that name none. An explicit default (``--voice``,
        ``explicit``) is kept as given. An automatic one (chosen at start, or the
        first time it is needed by a server that started with no voice) follows the rule
        of ``pick_default_voice`` among the voices that can be spoken (``speakable_voices``:
        not a preset of a VoiceDesign model this GPU cannot hold; among all voices where none
        can) at each read: while the voice it names is in the catalogue and can be spoken it
        stays; once that voice is gone (its clip deleted or renamed, in the studio or the
        folder) or cannot be spoken another is picked by the same rule, and the change is
        logged once. An explicit default that cannot be spoken is kept, and said once at
        ERROR (``_check_pinned``). None while the catalogue holds no voice at all. Reading it does not re-read
        the voices folder (the doors refresh the catalogue); it costs one pass over the
        catalogue's voices."""
        if self.explicit:
            self._check_pinned()
            return self._name
        voices = self._catalog.voices()
        current = self._name
        held = next((v for v in voices if v.name == current), None)
        mute = self._unspeakable(held) if held is not None else None
        if held is not None and mute is None:
            return current
        spoken = [v.name for v in voices if self._unspeakable(v) is None]
        chosen = pick_default_voice(spoken or [v.name for v in voices])  # none spoken: the refusal says why
        if chosen != current:
            self._name = chosen
            if chosen is None:
                _LOGGER.info("Default voice: none, %s is gone and no voice is left", current)
            elif current is None:
                _LOGGER.info("Default voice: %s, %s (--voice chooses another)", chosen, first_default_reason(chosen, len(voices)))
            elif mute is not None:
                _LOGGER.info("Default voice: %s, as %s cannot be spoken (%s; --voice chooses one to keep)", chosen,
                             current, mute)
            else:
                _LOGGER.info("Default voice: %s, as %s is gone (--voice chooses one to keep)", chosen, current)
        return chosen

    def _check_pinned(self) -> bool:
        """Whether the explicit default voice is served now; logs a WARNING once when it
        stops being served, and once when it is back; an ERROR once when its model cannot be
        served on this GPU (``unspeakable``: it is still "served", and its requests are
        refused with ``ModelUnservableError``)."""
        assert self._name is not None
        voice = self._catalog.find(self._name)
        served = voice is not None
        mute = self._unspeakable(voice) if voice is not None and not self._pinned_mute_said else None
        if mute is not None:
            self._pinned_mute_said = True
            name = self._name
            _LOGGER.error(
                "The default voice %s (--voice %s) cannot be spoken: %s. Requests that name no voice are refused "
                "until you choose a default voice of another model (--voice, the add-on's voice option; these can "
                "be spoken: %s) and restart, or free the GPU memory that model needs and restart", name, name, mute,
                shown_names([v.name for v in self._speakable()]),
            )
        if served == self._pinned_gone:  # it changed
            self._pinned_gone = not served
            if served:
                _LOGGER.warning("The default voice %s (--voice %s) is served again: requests that name no voice "
                                "are spoken with it", self._name, self._name)
            else:
                _LOGGER.warning("%s", self.gone_message(log=True))
        return served

    @property
    def served(self) -> bool:
        """False while the explicit default voice (``--voice``) is no longer served (its clip
        was removed or broken by hand): requests naming no voice are refused with
        ``DefaultVoiceGoneError``. True otherwise (an automatic default is always served)."""
        return not self.explicit or self._check_pinned()

    def gone_message(self, log: bool = False) -> str:
        """Why the explicit default voice is not served, and how to fix it. ``log``: the
        server log's WARNING, in full (why, the two fixes, the voices still served). Else a
        refused request's message: two short sentences, short enough for Home Assistant's pipeline
        error (under 200 characters for a name of the studio's ``MAX_NAME_CHARS``), naming
        the voice, what is wrong and what to do; the log holds the detail."""
        name = self._name
        clip = self._catalog.skipped_clip(name) if name is not None else None
        # The skipped record names the transcript where it is the fault (the clip is fine).
        transcript = clip.transcript if clip is not None else None
        if not log:
            if transcript is not None:
                assert clip is not None
                return (f"The default voice {name!r} (--voice) cannot be used: its transcript {transcript} could not "
                        f"be used (see the server log). Save it {clip.transcript_fix}, or choose another default voice")
            if clip is not None:
                return (f"The default voice {name!r} (--voice) cannot be used: its clip is skipped (see the server "
                        "log). Replace the clip, or choose another default voice")
            return (f"The default voice {name!r} (--voice) is no longer in the voices folder. Put it back, or "
                    "choose another default voice")
        if clip is not None and transcript is not None:
            why = f"its transcript {transcript} could not be used, so its clip {clip.file} is skipped ({clip.reason})"
            put_back = f"save its transcript {transcript} {clip.transcript_fix}"
        else:
            why = (f"its clip {clip.file} is skipped ({clip.reason})" if clip is not None
                   else "no clip or preset of that name is in the voices folder any more")
            put_back = (f"put its clip back ({name}.wav and its transcript {name}.txt in the voices folder"
                        + (", or upload one in the voice studio" if self._studio else "") + ")")
        names = [v.name for v in self._catalog.voices()]
        shown = shown_names(names)
        fix = f"{put_back}, or choose another default voice (--voice, the add-on's voice option) and restart"
        served = f"; requests that name a voice are served (available: {shown})" if names else "; no voice is left"
        return (f"The default voice {name} (--voice {name}) is no longer served: {why}. Requests that name no "
                f"voice are refused until you {fix}{served}")

    @property
    def pinned(self) -> str | None:
        """The default voice if it is explicit (``--voice``): the studio may not rename or
        delete it. None for an automatic default, which may go (the next request picks
        another, ``name``)."""
        return self._name if self.explicit else None


def shown_names(names: list[str], most: int = 12) -> str:
    """Voice ``names`` for a message, by name regardless of case (as the studio and
    ``GET /v1/audio/voices`` list them): the first ``most``, then how many in all; "none"
    for none."""
    ordered = sorted(names, key=name_order)
    return ", ".join(ordered[:most]) + (f", ... ({len(ordered)} in all)" if len(ordered) > most else "") or "none"


def pick_default_voice(names: list[str]) -> str | None:
    """The default voice among the catalogue's voice ``names`` when ``--voice`` names none:
    ``DEFAULT_VOICE`` if it is one of them, else the first by name; None when there are none."""
    if not names:
        return None
    return DEFAULT_VOICE if DEFAULT_VOICE in names else min(names, key=name_order)


#: How ``pick_default_voice`` chooses, in the log's words.
DEFAULT_RULE = f"{DEFAULT_VOICE} if there is one, else the first by name"


def first_default_reason(chosen: str, added: int) -> str:
    """Why a server that had no voice took ``chosen`` as its default from the ``added``
    voices (at least one) that came in together, for the log line that names it: "the first
    voice added", or for several (a copy of clips into the voices folder, found by one scan)
    which rule of ``pick_default_voice`` chose it among them."""
    if added == 1:
        return "the first voice added"
    if chosen == DEFAULT_VOICE:
        return f"of the {added} voices added together, {DEFAULT_VOICE} (taken first when there is one)"
    return f"the first by name of the {added} voices added together"
