"""The Responses API's store (handler/api/responses/store.py): bounded by bytes and by age, and a
404 naming the field and saying why an id is not here."""

from __future__ import annotations

import json
import logging
import sys
import threading

import pytest

from handler.api.responses.store import ResponseStore, StoredResponse
from handler.errors import NotFound, to_http

BIG_TEXT = "x" * 50_000  # in the output and the conversation: ~100 KB an entry, one string for all


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stored(response_id: str, text: str = "hello") -> StoredResponse:
    response = {"id": response_id, "object": "response", "output_text": text}
    items = ({"id": f"msg_{response_id}", "type": "message", "role": "user", "content": "hi"},)
    conversation = ({"role": "user", "content": "hi"}, {"role": "assistant", "content": text})
    return StoredResponse(response, items, conversation)


def rid(i: int) -> str:
    return f"resp_{i:032x}"  # one width: every entry of a test has the same size


def not_found(store: ResponseStore, response_id: str, param: str = "previous_response_id") -> NotFound:
    with pytest.raises(NotFound) as caught:
        store.get(response_id, param=param)
    return caught.value


def test_put_then_get_returns_what_was_stored_and_counts_its_json_bytes():
    store = ResponseStore(max_bytes=10_000, max_age_s=60)
    entry = stored(rid(1), text="café")
    store.put(rid(1), entry)
    assert store.get(rid(1)) is entry
    assert len(store) == 1
    compact = json.dumps([entry.response, entry.input_items, entry.conversation], separators=(",", ":"))
    # UTF-8 bytes: "é" is 2 bytes where compact (ASCII-escaped) JSON writes 6, counted twice
    assert store.bytes_used == entry.size() == len(compact) - 2 * (6 - 2)


def test_a_second_put_of_an_id_replaces_it_and_is_counted_once():
    store = ResponseStore(max_bytes=10_000, max_age_s=60)
    store.put(rid(1), stored(rid(1), "a"))
    store.put(rid(1), stored(rid(1), "b"))
    assert store.get(rid(1)).response["output_text"] == "b"
    assert (len(store), store.bytes_used) == (1, stored(rid(1), "b").size())


def test_the_byte_bound_holds_under_1000_responses_of_100_kb():
    size = stored(rid(0), BIG_TEXT).size()
    assert 100_000 < size < 101_000
    store = ResponseStore(max_bytes=5 * 2**20, max_age_s=3600)
    fits = store.max_bytes // size
    for i in range(1000):
        store.put(rid(i), stored(rid(i), BIG_TEXT))
        assert store.bytes_used <= store.max_bytes
        assert store.get(rid(i)).response["id"] == rid(i)
    assert len(store) == fits  # full: no entry evicted that fitted
    assert store.bytes_used == fits * size
    for i in range(1000 - fits, 1000):  # the newest are all there
        store.get(rid(i))
    for i in (0, 500, 999 - fits):  # the oldest went first
        assert "evicted" in not_found(store, rid(i)).message
    stats = store.stats()
    assert (stats["entries"], stats["evicted"], stats["bytes"]) == (fits, 1000 - fits, fits * size)


def test_entries_expire_by_age_oldest_first():
    clock = FakeClock()
    store = ResponseStore(max_bytes=10_000, max_age_s=100, clock=clock)
    store.put(rid(1), stored(rid(1)))
    clock.now += 50
    store.put(rid(2), stored(rid(2)))
    clock.now += 50  # rid(1) is exactly max_age_s old: still kept
    store.get(rid(1))
    clock.now += 0.5
    error = not_found(store, rid(1))
    assert "expired: the store keeps responses for 100 s" in error.message
    assert store.get(rid(2)) is not None
    assert (len(store), store.bytes_used) == (1, stored(rid(2)).size())
    clock.now += 50
    assert (len(store), store.bytes_used, store.stats()["expired"]) == (0, 0, 2)


def test_a_put_drops_the_expired_before_evicting_for_space():
    clock = FakeClock()
    size = stored(rid(0)).size()
    store = ResponseStore(max_bytes=2 * size, max_age_s=10, clock=clock)
    store.put(rid(1), stored(rid(1)))
    clock.now += 5
    store.put(rid(2), stored(rid(2)))
    clock.now += 6  # rid(1) expired, rid(2) not: the new entry takes rid(1)'s place
    store.put(rid(3), stored(rid(3)))
    assert store.get(rid(2)) and store.get(rid(3))
    assert "expired" in not_found(store, rid(1)).message
    assert store.stats()["evicted"] == 0


def each_reason(param: str) -> dict[str, NotFound]:
    """A store with an id gone for each reason, and the 404 each gives."""
    clock = FakeClock()
    size = stored(rid(0)).size()
    store = ResponseStore(max_bytes=2 * size, max_age_s=60, clock=clock)
    store.put(rid(1), stored(rid(1)))  # expires
    clock.now += 61
    for i in (2, 3, 4, 5):  # rid(2) evicted by 4, rid(3) by 5
        store.put(rid(i), stored(rid(i)))
    store.delete(rid(5))
    store.put(rid(6), stored(rid(6), "y" * 3 * size))  # too large
    ids = {"expired": rid(1), "evicted": rid(2), "deleted": rid(5), "too_large": rid(6), "unknown": rid(7)}
    return {reason: not_found(store, response_id, param) for reason, response_id in ids.items()}


@pytest.mark.parametrize("param", ["previous_response_id", "response_id"])
def test_each_404_names_the_param_and_says_why(param):
    size = stored(rid(0)).size()
    errors = each_reason(param)
    why = {
        "expired": "expired: the store keeps responses for 60 s",
        "evicted": f"was evicted: the store keeps {2 * size} bytes of responses per worker",
        "deleted": "was deleted",
        "too_large": "was not stored because it was too large",
        "unknown": "is unknown on this worker: responses are stored per worker",
    }
    for reason, error in errors.items():
        assert error.param == param
        assert error.message.startswith(f"{param} 'resp_"), error.message
        assert why[reason] in error.message, (reason, error.message)
        assert to_http(error).status == 404
    assert "store: false" in errors["unknown"].message and "sticky sessions" in errors["unknown"].message


def test_the_bound_is_shown_in_mib():
    store = ResponseStore(max_bytes=3 * 2**20, max_age_s=3600)
    store.put(rid(1), StoredResponse({"text": "z" * (3 * 2**20)}, (), ()))
    assert "over the whole store's 3 MiB" in not_found(store, rid(1)).message


def test_an_entry_larger_than_the_bound_is_not_stored_and_evicts_nothing(caplog):
    size = stored(rid(0)).size()
    store = ResponseStore(max_bytes=3 * size, max_age_s=60)
    for i in (1, 2):
        store.put(rid(i), stored(rid(i)))
    with caplog.at_level(logging.INFO, logger="handler.api.responses.store"):
        store.put(rid(3), stored(rid(3), "y" * 4 * size))
    assert f"response {rid(3)} not stored" in caplog.text
    assert "too large" in not_found(store, rid(3)).message
    assert (len(store), store.bytes_used) == (2, 2 * size)
    assert store.get(rid(1)) and store.get(rid(2))
    assert store.stats()["too_large"] == 1


def test_delete_forgets_the_response_and_a_second_delete_is_a_404():
    store = ResponseStore(max_bytes=10_000, max_age_s=60)
    store.put(rid(1), stored(rid(1)))
    store.delete(rid(1))
    assert (len(store), store.bytes_used) == (0, 0)
    assert "was deleted" in not_found(store, rid(1)).message
    with pytest.raises(NotFound, match="was deleted") as again:
        store.delete(rid(1), param="response_id")
    assert again.value.param == "response_id"
    with pytest.raises(NotFound, match="unknown on this worker"):
        store.delete(rid(2))


def test_a_stored_again_id_is_no_longer_reported_gone():
    store = ResponseStore(max_bytes=10_000, max_age_s=60)
    store.put(rid(1), stored(rid(1)))
    store.delete(rid(1))
    store.put(rid(1), stored(rid(1)))
    assert store.get(rid(1))
    assert store.stats()["forgotten_ids"] == 0


def test_the_memory_of_forgotten_ids_stays_bounded():
    size = stored(rid(0)).size()
    store = ResponseStore(max_bytes=size, max_age_s=60, forgotten_ids=10)
    for i in range(100):
        store.put(rid(i), stored(rid(i)))
    stats = store.stats()
    assert (stats["entries"], stats["evicted"], stats["forgotten_ids"]) == (1, 99, 10)
    for i in range(89, 99):  # the last 10 forgotten keep their reason
        assert "evicted" in not_found(store, rid(i)).message
    assert "unknown on this worker" in not_found(store, rid(88)).message


def test_an_odd_id_is_quoted_short_and_printable():
    store = ResponseStore(max_bytes=10_000, max_age_s=60)
    message = not_found(store, "\ud800" + "a" * 1000).message
    message.encode("utf-8")  # a lone surrogate is escaped, not echoed
    assert "\\ud800" in message and len(message) < 500


def test_a_store_needs_positive_bounds():
    for max_bytes, max_age_s in ((0, 60), (10, 0), (-1, 60)):
        with pytest.raises(ValueError):
            ResponseStore(max_bytes, max_age_s)


@pytest.fixture
def fast_switching():
    """Threads switch every microsecond, so that 8 of them interleave inside the store's methods."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def run_threads(work, count: int = 8) -> None:
    failures: list[BaseException] = []

    def guarded(t: int) -> None:
        try:
            work(t)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures


def thread_id(t: int, k: int) -> str:
    return f"resp_{t:02d}{k:030x}"


@pytest.mark.usefixtures("fast_switching")
def test_8_threads_keep_the_bound_and_evict_only_what_does_not_fit():
    size, puts = stored(thread_id(0, 0)).size(), 500
    store = ResponseStore(max_bytes=40 * size, max_age_s=3600)

    def work(t: int) -> None:
        for k in range(puts):
            store.put(thread_id(t, k), stored(thread_id(t, k)))
            assert store.bytes_used <= store.max_bytes
            try:
                store.get(thread_id(t, max(k - 1, 0)))
            except NotFound as error:
                assert "evicted" in error.message

    run_threads(work)
    assert (len(store), store.bytes_used) == (40, 40 * size)  # full, and counted right
    assert store.stats()["evicted"] == 8 * puts - 40
    for t in range(8):  # each thread's kept ids are its newest: the store dropped oldest first
        kept = []
        for k in range(puts):
            try:
                store.get(thread_id(t, k))
                kept.append(k)
            except NotFound as error:
                assert "evicted" in error.message
        assert kept == list(range(puts - len(kept), puts))


@pytest.mark.usefixtures("fast_switching")
def test_8_threads_lose_nothing_that_fits():
    size, puts = stored(thread_id(0, 0)).size(), 500
    store = ResponseStore(max_bytes=8 * puts * size, max_age_s=3600)

    def work(t: int) -> None:
        for k in range(puts):
            store.put(thread_id(t, k), stored(thread_id(t, k)))
            assert store.get(thread_id(t, k)).response["id"] == thread_id(t, k)
            if k % 3 == 0:
                store.delete(thread_id(t, k))

    run_threads(work)
    kept = 8 * (puts - len(range(0, puts, 3)))
    assert (len(store), store.bytes_used) == (kept, kept * size)
    for t in range(8):
        for k in range(puts):
            if k % 3:
                store.get(thread_id(t, k))
            else:
                assert "deleted" in not_found(store, thread_id(t, k)).message
    assert store.stats()["evicted"] == 0
