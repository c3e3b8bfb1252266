"""Stop strings over a text stream.

Text that could still turn out to be the beginning of a stop string is held back,
so a client never receives part of a stop string that is then cut off.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._pending = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Add generated text; return what is safe to send now."""
        if not self._stops:
            return delta
        text = self._pending + delta
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._pending = ""
            return text[:cut]
        hold = max((k for s in self._stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """At the end of generation, held-back text was not a stop string after all."""
        text, self._pending = self._pending, ""
        return text
