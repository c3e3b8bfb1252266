import random

from handler.engine.stops import StopStringMatcher


def feed_all(matcher, pieces):
    return [matcher.feed(p) for p in pieces]


def test_no_stops_pass_through():
    m = StopStringMatcher(())
    assert feed_all(m, ["a", "b"]) == ["a", "b"]


def test_stop_split_across_pieces_is_never_sent():
    m = StopStringMatcher(("END",))
    sent = feed_all(m, ["hello E", "N", "D world"])
    assert "".join(sent) == "hello "
    assert m.stopped


def test_false_alarm_is_released_when_it_cannot_be_a_stop():
    m = StopStringMatcher(("END",))
    assert feed_all(m, ["hello E", "Nx"]) == ["hello ", "ENx"]
    assert not m.stopped


def test_earliest_of_several_stops_wins():
    m = StopStringMatcher(("\n\n", "b"))
    assert m.feed("a\n\nb") == "a"
    assert m.stopped


def test_flush_returns_held_back_text_at_the_end():
    m = StopStringMatcher(("END",))
    assert m.feed("abcEN") == "abc"
    assert m.flush() == "EN"


def reference_feed(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    """What a client must get, computed the slow, obvious way: every piece's text up to the earliest
    stop string found so far, holding back any end that begins a stop string."""
    sent: list[str] = []
    text, released = "", 0
    for piece in pieces:
        text += piece
        found = [i for i in (text.find(s) for s in stops) if i >= 0]
        if found:
            sent.append(text[released : min(found)])
            return sent, True
        hold = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        sent.append(text[released : len(text) - hold])
        released = len(text) - hold
    sent.append(text[released:])
    return sent, False


def test_the_automaton_sends_what_the_obvious_matcher_sends():
    rng = random.Random(7)
    for _ in range(3000):
        stops = tuple("".join(rng.choice("ab c") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4)))
        pieces = ["".join(rng.choice("ab c") for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 8))]
        matcher = StopStringMatcher(stops)
        sent = []
        for piece in pieces:
            sent.append(matcher.feed(piece))
            if matcher.stopped:
                break
        if not matcher.stopped:
            sent.append(matcher.flush())
        assert (sent, matcher.stopped) == reference_feed(stops, pieces), (stops, pieces)


def test_a_long_stop_string_costs_each_token_only_its_own_text():
    """A 4096-character stop string that the text keeps almost matching: each token walks the
    automaton once per character it added (counted, not timed)."""
    stop = "x" * 4095 + "y"
    matcher = StopStringMatcher((stop,))
    automaton = matcher._automaton
    steps = 0
    original = automaton.step

    def counting_step(state: int, char: str) -> int:
        nonlocal steps
        steps += 1
        return original(state, char)

    automaton.step = counting_step
    for _ in range(4095):
        assert matcher.feed("x") == ""  # held back: it may still become the stop string
    assert matcher.feed("y") == "" and matcher.stopped
    assert steps == 4096
