"""The real handler in continuous mode, driven the way TorchServe's continuousBatching
frontend drives it (tests/support/torchserve_harness.py: ContinuousFrontend), with the tiny model
on CPU: requests join and leave between steps, each gets its own answer."""

import json
import threading
import time

import pytest

import handler.serving.continuous as continuous
import handler.serving.jobs as jobs
from handler.failpoints import ENV_VAR as FAILPOINT_ENV
from handler.inf2_handler import Inf2StreamingHandler
from tests.support.torchserve_harness import ContinuousFrontend, generation_ends, make_context

N_SLOTS = 2


def model_yaml(model_dir, overlap=True, **handler):
    return {
        "continuousBatching": True,
        "batchSize": 2 * N_SLOTS,
        "handler": {"model_checkpoint_dir": str(model_dir), "n_positions": 128, "max_new_tokens": 100, **handler},
        "scheduler": {"mode": "continuous", "n_slots": N_SLOTS, "overlap": overlap},
    }


@pytest.fixture(scope="module", params=[True, False], ids=["overlap", "inline"])
def served(request, tiny_model_dir):
    handler = Inf2StreamingHandler()
    context = make_context(model_yaml(tiny_model_dir, overlap=request.param), str(tiny_model_dir))
    handler.initialize(context)
    yield handler, context
    handler.shutdown()


@pytest.fixture
def frontend(served):
    handler, context = served
    yield ContinuousFrontend(handler, context, batch_size=2 * N_SLOTS)
    assert handler.serving.engine.occupied == 0  # no slot leaked by the test


def text_of(reply):
    if reply.content_type == "application/json":
        return json.loads(reply.body)["text"]
    return "".join(line.get("text", "") for line in reply.lines)


def test_streams_ndjson_while_generating(frontend, tiny_tokenizer):
    with generation_ends(frontend.handler) as ends:
        (reply,) = frontend.serve([{"prompt": "Today the weather is", "max_new_tokens": 20, "ignore_eos": True}])
    assert (reply.status, reply.content_type, reply.streamed, reply.broken) == (
        200,
        "application/x-ndjson",
        True,
        False,
    )
    assert len(reply.sent_at) > 1 and reply.sent_at[0] < ends[-1]  # text went out before the last step
    assert all(set(line) == {"text"} for line in reply.lines[:-1])
    assert reply.lines[-1]["finish_reason"] == "length"
    prompt_tokens = len(tiny_tokenizer("Today the weather is")["input_ids"])
    assert reply.lines[-1]["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 20}


def test_non_streamed_is_one_body(frontend):
    """Its response opens before its prefill (to learn whether its client is there) and empty
    replies keep looking at the socket; the body goes out whole, as the one chunk."""
    (reply,) = frontend.serve([{"prompt": "Serving many users", "max_new_tokens": 12, "stream": False}])
    assert (reply.status, reply.content_type, reply.broken, reply.streamed) == (200, "application/json", False, True)
    assert len(reply.chunks) == 1 and reply.replies > 2
    assert json.loads(reply.body)["finish_reason"] in {"eos", "length"}


def test_a_request_whose_client_left_before_its_slot_is_never_prefilled(frontend, monkeypatch):
    backend = frontend.handler.serving.service.backend
    prefilled: list[int] = []  # prompt lengths
    original = backend.prefill

    def counting_prefill(requests):
        prefilled.extend(len(r.prompt_ids) for r in requests)
        return original(requests)

    monkeypatch.setattr(backend, "prefill", counting_prefill)
    running = [
        frontend.submit({"prompt": f"busy {i}", "max_new_tokens": 30, "ignore_eos": True}) for i in range(N_SLOTS)
    ]
    while not all(frontend.replies[r].chunks for r in running):
        frontend.call()
    left = [frontend.submit({"prompt": f"gone {i}", "max_new_tokens": 30, "stream": False}) for i in range(N_SLOTS)]
    for request_id in left:
        frontend.cancel(request_id)  # closed right after sending, while every slot is busy
    staying = frontend.submit({"prompt": "still here", "max_new_tokens": 4, "ignore_eos": True})
    frontend.run()
    assert len(prefilled) == N_SLOTS + 1  # the busy ones and the one whose client stayed, not those that left
    assert all(frontend.replies[r].chunks == [] for r in left)
    assert frontend.replies[staying].lines[-1]["finish_reason"] == "length"


def test_a_non_streamed_request_whose_client_left_mid_generation_frees_its_slot(frontend):
    """(With a batch-mate: a frontend holding no job makes no call, and the next arrival's call
    finds the request gone.)"""
    engine = frontend.handler.serving.engine
    mate = frontend.submit({"prompt": "a batch-mate", "max_new_tokens": 60, "ignore_eos": True})
    left = frontend.submit({"prompt": "long and unwatched", "max_new_tokens": 90, "stream": False, "ignore_eos": True})
    while engine.occupied < 2:
        frontend.call()
    frontend.cancel(left)
    steps_at_cancel = engine.steps
    while engine.occupied == 2:
        frontend.call()
    assert engine.steps - steps_at_cancel <= 3  # noticed at the next reply, freed at the next step
    frontend.run()
    assert frontend.replies[mate].lines[-1]["usage"]["completion_tokens"] == 60
    assert frontend.replies[left].chunks == []


def test_a_request_joining_mid_decode_gets_its_solo_tokens(frontend):
    body = {"prompt": "Large language models generate text", "max_new_tokens": 24, "ignore_eos": True}
    (alone,) = frontend.serve([body])
    first = frontend.submit({"prompt": "an earlier request", "max_new_tokens": 40, "ignore_eos": True})
    for _ in range(4):  # the earlier one is decoding
        frontend.call()
    assert frontend.replies[first].chunks, "the earlier request should be mid-stream"
    joined = frontend.submit(body)
    frontend.run()
    assert text_of(frontend.replies[joined]) == text_of(alone)
    assert frontend.replies[first].lines[-1]["usage"]["completion_tokens"] == 40


def test_one_bad_request_among_running_ones(frontend):
    running = frontend.submit({"prompt": "Once upon a time", "max_new_tokens": 30, "ignore_eos": True})
    frontend.call()
    bad = frontend.submit({"prompt": "bad", "top_p": 3})
    garbage = frontend.submit(b"\xff\xfe")
    frontend.run()
    for request_id in (bad, garbage):
        reply = frontend.replies[request_id]
        assert (reply.status, reply.streamed, reply.broken, reply.content_type) == (
            400,
            False,  # a plain response on 0.11 too: a stream opened with a 400 loses its body
            False,
            "application/json",
        )
    assert json.loads(frontend.replies[bad].body)["error"]["param"] == "top_p"
    assert frontend.replies[running].lines[-1]["finish_reason"] == "length"


def test_more_requests_than_slots_wait_and_all_finish(frontend):
    bodies = [{"prompt": f"request number {i}", "max_new_tokens": 8 + i, "ignore_eos": True} for i in range(7)]
    replies = frontend.serve(bodies)
    assert [r.lines[-1]["usage"]["completion_tokens"] for r in replies] == [8 + i for i in range(7)]
    assert not any(r.broken for r in replies)


def test_cancelled_stream_frees_its_slot_for_a_waiting_request(frontend):
    engine = frontend.handler.serving.engine
    long = [frontend.submit({"prompt": f"long {i}", "max_new_tokens": 90, "ignore_eos": True}) for i in range(N_SLOTS)]
    while not frontend.replies[long[0]].chunks:
        frontend.call()
    waiting = frontend.submit({"prompt": "waiting for a slot", "max_new_tokens": 5, "ignore_eos": True})
    frontend.call()
    assert frontend.handler.serving.client.waiting == 1 and engine.waiting == 0  # waits at the client's gate
    frontend.cancel(long[0])  # the client went away after its first chunks
    steps_at_cancel = engine.steps
    while not frontend.replies[waiting].chunks:
        frontend.call()
    # the frontend drops it after its next reply; the call after that frees its slot and asks the
    # waiting request's client, which is confirmed in the next call and prefilled in the next step
    assert engine.steps - steps_at_cancel <= 3
    frontend.cancel(long[1])
    frontend.run()
    assert frontend.replies[waiting].lines[-1]["finish_reason"] == "length"
    # a frontend holding no job makes no call: the next arrival's call finds long[1] gone
    (after,) = frontend.serve([{"prompt": "next", "max_new_tokens": 2, "ignore_eos": True}])
    assert after.lines[-1]["finish_reason"] == "length"


def test_failure_at_a_decode_step_fails_that_step_and_the_next_request_is_served(frontend, monkeypatch):
    monkeypatch.setenv(FAILPOINT_ENV, "FAIL-HERE")
    streamed = frontend.submit({"prompt": "FAIL-HERE please", "max_new_tokens": 30, "ignore_eos": True})
    whole = frontend.submit({"prompt": "batch-mate", "max_new_tokens": 30, "stream": False, "ignore_eos": True})
    frontend.run()
    streamed, whole = frontend.replies[streamed], frontend.replies[whole]
    assert streamed.status == 200 and streamed.streamed and streamed.lines[-1]["error"]["type"] == "server_error"
    # on TorchServe its response opened before its prefill: the error body comes under the 200
    assert whole.status == 200 and "injected failure" in json.loads(whole.body)["error"]["message"]
    assert not streamed.broken and not whole.broken
    (after,) = frontend.serve([{"prompt": "still here?", "max_new_tokens": 5, "stream": False}])
    assert after.status == 200


def test_torchserve_0_11_ends_one_reply_answers_with_a_closing_call(served, monkeypatch):
    """0.11 treats a stopping criterion's None as 'continue': one-reply answers open a
    stream and the next call closes it with an empty last chunk."""
    handler, context = served
    monkeypatch.setattr(jobs, "ONE_SHOT_REPLIES", False)
    frontend = ContinuousFrontend(handler, context, batch_size=2 * N_SLOTS, version=(0, 11))
    whole, bad, streamed = frontend.serve(
        [
            {"prompt": "Serving many users", "max_new_tokens": 6, "stream": False},
            {"prompt": "bad", "max_new_tokens": 0},
            {"prompt": "Today the weather is", "max_new_tokens": 6, "ignore_eos": True},
        ]
    )
    assert (whole.status, whole.done, whole.broken) == (200, True, False)
    assert json.loads(whole.body)["usage"]["completion_tokens"] <= 6
    assert (bad.status, bad.done, bad.broken) == (400, True, False)
    assert json.loads(bad.body)["error"]["param"] == "max_new_tokens"
    assert streamed.lines[-1]["finish_reason"] == "length" and not streamed.broken
    assert handler.serving.engine.occupied == 0


def test_openai_stream_and_model_listing(frontend):
    chat, listing = frontend.serve(
        [
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True},
            {},
        ],
        headers=[{}, {"url_path": "v1/models"}],
    )
    assert chat.content_type == "text/event-stream" and chat.body.endswith("data: [DONE]\n\n")
    assert json.loads(listing.body)["data"][0]["id"] == "m"


def test_a_hung_step_fails_the_requests_in_flight_instead_of_hanging(tiny_model_dir):
    handler = Inf2StreamingHandler()
    context = make_context(model_yaml(tiny_model_dir, step_timeout_s=0.3), str(tiny_model_dir))
    handler.initialize(context)
    backend = handler.serving.service.backend
    release = threading.Event()
    original = backend.decode

    def hung_decode(slots):
        release.wait(30)
        return original(slots)

    try:
        backend.decode = hung_decode
        frontend = ContinuousFrontend(handler, context, batch_size=2 * N_SLOTS)
        streamed, whole = frontend.serve(
            [
                {"prompt": "Today the weather is", "max_new_tokens": 8, "ignore_eos": True},
                {"prompt": "Serving many users", "max_new_tokens": 8, "stream": False},
            ]
        )
        for reply in (streamed, whole):
            assert reply.done and not reply.broken
            error = reply.lines[-1]["error"] if reply.streamed else json.loads(reply.body)["error"]
            assert "did not finish a step" in error["message"]
        assert whole.status == 200 and whole.streamed  # on TorchServe its response opened before its prefill
        release.set()
        backend.decode = original
        (after,) = frontend.serve([{"prompt": "still here?", "max_new_tokens": 4, "stream": False}])
        assert after.status == 200
    finally:
        release.set()
        handler.shutdown()


@pytest.mark.parametrize(("admission_wait", "steps_later"), [(0.5, 1), (0.0, 2)], ids=["held", "not-held"])
def test_a_request_arriving_mid_step_is_prefilled_in_the_next_step(tiny_model_dir, admission_wait, steps_later):
    """The frontend hands over an arrival only in its call after the running step; an overlapped
    engine has started the next step by then. Holding that step for the call (a slot was just
    freed, two streams run) prefills the newcomer one step sooner; without the hold it waits a
    step more (the control)."""
    yaml = model_yaml(tiny_model_dir)
    yaml["scheduler"] |= {"admission_wait": admission_wait, "n_slots": 3}
    handler = Inf2StreamingHandler()
    context = make_context(yaml, str(tiny_model_dir))
    handler.initialize(context)
    engine = handler.serving.engine
    backend = handler.serving.service.backend
    decode, prefill = backend.decode, backend.prefill
    prefilled_after: list[int] = []  # steps completed when each prefill started, in order

    def slow_decode(slots):
        time.sleep(0.3)
        return decode(slots)

    def recording_prefill(requests):
        prefilled_after.extend(engine.steps for _ in requests)
        return prefill(requests)

    backend.decode, backend.prefill = slow_decode, recording_prefill
    frontend = ContinuousFrontend(handler, context, batch_size=6)
    stop = threading.Event()

    def frontend_loop():
        while not stop.is_set():
            frontend.call() if frontend.busy else time.sleep(0.002)

    loop = threading.Thread(target=frontend_loop, daemon=True)
    loop.start()
    try:
        for prompt, tokens in (("an earlier request", 8), ("another one", 8), ("a brief one", 2)):
            frontend.submit({"prompt": prompt, "max_new_tokens": tokens, "ignore_eos": True})
        _until(lambda: len(prefilled_after) == 3)  # one step: all three prefilled; the brief one ends in it
        _until(lambda: engine.steps >= 1 and 0.05 < engine.step_running_for() < 0.15)
        arrived_during = engine.steps + 1  # the step running now
        frontend.submit({"prompt": "a newcomer", "max_new_tokens": 2, "ignore_eos": True})
        _until(lambda: len(prefilled_after) == 4)
        assert prefilled_after[3] + 1 == arrived_during + steps_later
        _until(lambda: not frontend.busy)
    finally:
        stop.set()
        loop.join(timeout=30)
        handler.shutdown()


def _until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_a_request_without_a_slot_past_max_queue_wait_gets_a_503_with_retry_after(tiny_model_dir):
    """Issue 42, item 2, on TorchServe: both slots held by long streams (each decode made slow), a third
    request's wait is bounded by handler.max_queue_wait_s: a plain 503 with Retry-After while the
    holders still stream; the holders are untouched."""
    handler = Inf2StreamingHandler()
    context = make_context(model_yaml(tiny_model_dir, max_queue_wait_s=0.3), str(tiny_model_dir))
    handler.initialize(context)
    backend = handler.serving.service.backend
    decode = backend.decode

    def slow_decode(slots):
        time.sleep(0.05)
        return decode(slots)

    backend.decode = slow_decode
    try:
        frontend = ContinuousFrontend(handler, context, batch_size=2 * N_SLOTS)
        holders = [
            frontend.submit({"prompt": f"holder {i}", "max_new_tokens": 90, "ignore_eos": True}) for i in range(2)
        ]
        while not all(frontend.replies[h].chunks for h in holders):
            frontend.call()
        waiter = frontend.submit({"prompt": "waiting for a slot", "max_new_tokens": 5, "stream": True})
        while not frontend.replies[waiter].done:
            frontend.call()
        reply = frontend.replies[waiter]
        assert (reply.status, reply.content_type) == (503, "application/json")
        assert reply.headers.get("Retry-After") == "1"
        assert "max_queue_wait_s" in json.loads(reply.body)["error"]["message"]
        assert not any(frontend.replies[h].done for h in holders)  # answered while the slots were still busy
        frontend.run()
        assert [frontend.replies[h].lines[-1]["usage"]["completion_tokens"] for h in holders] == [90, 90]
    finally:
        handler.shutdown()


def test_a_request_whose_client_left_with_nothing_else_in_flight_is_forgotten(served, monkeypatch):
    """The frontend makes no call while it holds no job: the handler forgets what it still tracks
    after ORPHANED_AFTER_S without one, so the slot and the gauges come free."""
    handler, context = served
    monkeypatch.setattr(continuous, "ORPHANED_AFTER_S", 0.5)
    backend = handler.serving.service.backend
    decode = backend.decode

    def slow_decode(slots):  # 100 tokens take 5 s: the sweep, not the request's end, frees the slot
        time.sleep(0.05)
        return decode(slots)

    monkeypatch.setattr(backend, "decode", slow_decode)
    frontend = ContinuousFrontend(handler, context, batch_size=2 * N_SLOTS)
    engine = handler.serving.engine
    left = frontend.submit({"prompt": "nobody reads", "max_new_tokens": 100, "stream": False, "ignore_eos": True})
    while engine.occupied == 0:
        frontend.call()
    frontend.cancel(left)
    frontend.run()  # its next reply tells the frontend; then it has no job, and calls no more
    deadline = time.monotonic() + 4  # before it could have ended by itself
    while handler.serving.jobs:
        assert time.monotonic() < deadline, "the orphan is still tracked"
        time.sleep(0.05)
    assert engine.free_slots == engine.slots  # aborted: its slot is free at the next step
    assert handler.serving.client.waiting == 0 and frontend.replies[left].chunks == []
