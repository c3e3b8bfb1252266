"""The response state machine both frontends carry (handler/core/response.py), table-driven: real
wire formats (native NDJSON, OpenAI completions with `n`), real Sequences fed real tokens, and the
outputs it decides: whole responses, stream parts, in-band errors, n > 1 fan-in, the finish hook."""

from __future__ import annotations

import json

import pytest

from handler.api.native import NativeApi
from handler.api.openai import CompletionsApi
from handler.core.preparation import Work, choice_request
from handler.core.response import News, Output, ResponseMachine
from handler.engine.outbox import Update
from handler.engine.sequence import Sequence
from handler.errors import EngineError, InvalidRequest, Overloaded
from handler.request import Limits

EOS = 2
LIMITS = Limits(default_max_new_tokens=16, max_new_tokens=256)


class Finished:
    def __init__(self) -> None:
        self.sequences: list[Sequence] = []

    def request_finished(self, sequence: Sequence) -> None:
        self.sequences.append(sequence)


def prepared(tokenizer, api, body: dict, n: int = 1) -> Work:
    work = Work("req", api)
    request = api.parse(body, LIMITS, tokenizer)
    ids = tokenizer(request.prompt)["input_ids"]
    work.sequences = [
        Sequence(
            choice_request(request, i),
            ids,
            tokenizer,
            frozenset({EOS}),
            "req" if i == 0 else f"req/{i}",
            choice_index=i,
            response_id="req",
        )
        for i in range(n)
    ]
    return work


def advance(tokenizer, sequence: Sequence, text: str, end: bool = False) -> Update:
    delta = "".join(sequence.append(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"])
    if end:
        delta += sequence.append(EOS)
    return Update(sequence, delta, sequence.finished)


def failed(sequence: Sequence, text: str = "") -> Update:
    sequence.fail(EngineError("generation failed: the device fell over"))
    return Update(sequence, text, True)


def lines(output: Output) -> list[dict]:
    return [json.loads(line) for line in output.body.splitlines() if line.strip()]


def test_a_reply_or_an_error_from_preparation_is_one_whole_response_without_the_engine():
    work = Work("req", NativeApi())
    work.reply = '{"data": []}'
    output = ResponseMachine(work).immediate()
    assert output == Output('{"data": []}', "application/json", end=True, whole=True)
    work = Work("req", NativeApi())
    work.error = InvalidRequest("max_new_tokens must be positive", "max_new_tokens")
    output = ResponseMachine(work).immediate()
    assert output is not None and output.whole and output.status == 400 and output.end
    assert "max_new_tokens" in output.body and output.failed


STREAM = {"prompt": "Hello there", "max_new_tokens": 64, "stream": True}
WHOLE = {"prompt": "Hello there", "max_new_tokens": 64, "stream": False}


# (body, the steps: ("text", t) | ("end", t) | ("fail", t) | ("failure", None), what each step emits)
# emits: None (nothing yet), "part" (a stream part, not the last), "last" (the stream's last part),
# "whole-200", "whole-400", "whole-500", "inband" (the route's error line closing an open stream)
CASES = {
    "streamed: parts as text comes, the last with the finish": (
        STREAM,
        [("text", " one"), ("text", ""), ("end", " two")],
        ["part", None, "last"],
    ),
    "streamed: failing before any text is its own 500": (STREAM, [("fail", "")], ["whole-500"]),
    "streamed: failing with its first text sends the text, then the error line": (
        STREAM,
        [("fail", " some")],
        ["inband"],
    ),
    "streamed: failing after text is an error line": (STREAM, [("text", " one"), ("fail", "")], ["part", "inband"]),
    "streamed: the watchdog after the head is an error line": (
        STREAM,
        [("text", " one"), ("failure", None)],
        ["part", "inband"],
    ),
    "streamed: the watchdog before the head is a whole 500": (STREAM, [("failure", None)], ["whole-500"]),
    "whole: one body when it is whole": (WHOLE, [("text", " one"), ("end", " two")], [None, "whole-200"]),
    "whole: a failure is its own 500 whatever came before": (
        WHOLE,
        [("text", " one"), ("fail", "")],
        [None, "whole-500"],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_one_output(tiny_tokenizer, case):
    body, steps, expected = CASES[case]
    work = prepared(tiny_tokenizer, NativeApi(), body)
    finished = Finished()
    machine = ResponseMachine(work, finished)
    assert machine.immediate() is None
    sequence = work.sequences[0]
    got = []
    for kind, text in steps:
        if kind == "failure":
            news = News(failure=EngineError("the model did not finish a step within 3 s"))
        elif kind == "fail":
            news = News([failed(sequence, text)])
        else:
            news = News([advance(tiny_tokenizer, sequence, text, end=kind == "end")])
        got.append(describe(machine.feed(news)))
    assert got == expected
    assert machine.done
    assert finished.sequences == ([sequence] if expected[-1] in ("last", "whole-200") else [])
    assert machine.feed(News([Update(sequence, "late", True)])) is None  # nothing after the end


def describe(output: Output | None) -> str | None:
    if output is None:
        return None
    if output.whole:
        return f"whole-{output.status}"
    if output.end and '"error"' in output.body:
        return "inband"
    return "last" if output.end else "part"


def test_an_in_band_error_carries_the_text_that_came_with_it(tiny_tokenizer):
    work = prepared(tiny_tokenizer, NativeApi(), STREAM)
    machine = ResponseMachine(work)
    output = machine.feed(News([failed(work.sequences[0], " partial")]))
    assert output is not None and not output.whole and output.end
    parsed = lines(output)
    assert parsed[0]["text"] == " partial" and "error" in parsed[-1]


def completions(n: int, stream: bool) -> dict:
    return {"model": "m", "prompt": "Hello there", "max_tokens": 32, "n": n, "stream": stream}


def test_n_choices_streamed_end_each_on_its_own_and_close_when_all_did(tiny_tokenizer):
    work = prepared(tiny_tokenizer, CompletionsApi("m"), completions(2, True), n=2)
    finished = Finished()
    machine = ResponseMachine(work, finished)
    first, second = work.sequences
    one = machine.feed(News([advance(tiny_tokenizer, first, " a", end=True), advance(tiny_tokenizer, second, " b")]))
    assert one is not None and not one.end and one.content_type == "text/event-stream"
    assert one.body.count('"finish_reason":"stop"') + one.body.count('"finish_reason": "stop"') == 1
    assert machine.feed(News([advance(tiny_tokenizer, second, "")])) is None  # no text: nothing to send
    two = machine.feed(News([advance(tiny_tokenizer, second, " c", end=True)]))
    assert two is not None and two.end and two.body.rstrip().endswith("data: [DONE]")
    assert finished.sequences == [first, second]


def test_n_choices_whole_are_one_body_and_one_failing_fails_the_request(tiny_tokenizer):
    work = prepared(tiny_tokenizer, CompletionsApi("m"), completions(2, False), n=2)
    machine = ResponseMachine(work)
    first, second = work.sequences
    assert machine.feed(News([advance(tiny_tokenizer, first, " a", end=True)])) is None
    output = machine.feed(News([advance(tiny_tokenizer, second, " b", end=True)]))
    assert output is not None and output.whole and output.status == 200
    assert len(json.loads(output.body)["choices"]) == 2
    work = prepared(tiny_tokenizer, CompletionsApi("m"), completions(2, True), n=2)
    machine = ResponseMachine(work)
    first, second = work.sequences
    assert machine.feed(News([advance(tiny_tokenizer, first, " a")])) is not None
    output = machine.feed(News([failed(second)]))
    assert output is not None and output.end and not output.whole and '"error"' in output.body and machine.done


def test_an_overloaded_request_is_a_whole_503_with_retry_after_and_is_counted(tiny_tokenizer):
    work = prepared(tiny_tokenizer, NativeApi(), STREAM)
    counted = Finished()
    counted.reasons = []  # type: ignore[attr-defined]
    counted.rejected = counted.reasons.append  # type: ignore[attr-defined]
    output = ResponseMachine(work, counted).feed(News(failure=Overloaded("no slot within 30 s", "queue_wait")))
    assert output is not None and output.whole and output.status == 503
    assert output.headers == (("Retry-After", "1"),)
    assert counted.reasons == ["queue_wait"] and counted.sequences == []  # type: ignore[attr-defined]
