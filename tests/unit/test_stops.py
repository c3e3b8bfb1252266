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
