"""Stop strings over a text stream.

Text that could still turn out to be the beginning of a stop string is held back,
so a client never receives part of a stop string that is then cut off.

The stop strings are matched by an Aho-Corasick automaton, one character at a time: a
token's cost is the length of the text it added, whatever the stop strings' length or
number (comparing every prefix of every stop string with the text's end on each token
cost O(L²) per token for a stop string of length L). The automaton's state after a
character is the longest end of the text that is a beginning of some stop string, which
is exactly what must be held back.
"""

from __future__ import annotations

from collections import deque


class _Automaton:
    """The goto, failure and output functions of Aho-Corasick over the stop strings."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.goto: list[dict[str, int]] = [{}]
        self.depth = [0]
        self.fail = [0]
        self.matched: list[int] = [0]  # length of the longest stop string ending at the state (0: none)
        for stop in stops:
            self._add(stop)
        self._link()

    def _add(self, stop: str) -> None:
        state = 0
        for char in stop:
            nxt = self.goto[state].get(char)
            if nxt is None:
                nxt = len(self.goto)
                self.goto[state][char] = nxt
                self.goto.append({})
                self.depth.append(self.depth[state] + 1)
                self.fail.append(0)
                self.matched.append(0)
            state = nxt
        self.matched[state] = max(self.matched[state], len(stop))

    def _link(self) -> None:
        queue = deque(self.goto[0].values())
        while queue:
            state = queue.popleft()
            for char, nxt in self.goto[state].items():
                queue.append(nxt)
                back = self.fail[state]
                while back and char not in self.goto[back]:
                    back = self.fail[back]
                target = self.goto[back].get(char, 0)
                self.fail[nxt] = target if target != nxt else 0
                # A shorter stop string that ends here too starts later: keep the longest (earliest start).
                self.matched[nxt] = max(self.matched[nxt], self.matched[self.fail[nxt]])

    def step(self, state: int, char: str) -> int:
        while state and char not in self.goto[state]:
            state = self.fail[state]
        return self.goto[state].get(char, 0)


class StopStringMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._automaton = _Automaton(stops) if stops else None
        self._state = 0
        self._pending = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Add generated text; return what is safe to send now."""
        automaton = self._automaton
        if automaton is None:
            return delta
        text = self._pending + delta
        offset = len(self._pending)
        state, cut = self._state, -1
        for i, char in enumerate(delta):
            state = automaton.step(state, char)
            longest = automaton.matched[state]
            if longest:
                start = offset + i + 1 - longest
                cut = start if cut < 0 else min(cut, start)
        if cut >= 0:  # the earliest-starting stop string of the text so far ends the output
            self.stopped = True
            self._pending = ""
            self._state = 0
            return text[:cut]
        self._state = state
        hold = automaton.depth[state]
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """At the end of generation, held-back text was not a stop string after all."""
        text, self._pending = self._pending, ""
        return text
