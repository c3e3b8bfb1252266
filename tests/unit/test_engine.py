"""The micro-batch engine against scripted backends: no model, no TorchServe."""

import threading

import pytest
import torch

from handler.backends.base import Backend
from handler.engine import MicroBatchEngine
from handler.errors import EngineError
from handler.protocol import GenerationRequest
from handler.sequence import FinishReason, Sequence, State

EOS = 2


class ScriptedBackend(Backend):
    """Emits pre-scripted token columns; records how many steps it ran."""

    name = "scripted"
    n_positions = 1024
    eos_token_ids = frozenset({EOS})

    def __init__(self, tokenizer, steps: list[list[int]], fail_at: int | None = None, hang: bool = False):
        self.tokenizer = tokenizer
        self.steps = steps
        self.fail_at = fail_at
        self.hang = hang
        self.steps_run = 0
        self.release = threading.Event()
        self.is_finished = None

    def generate(self, rows, streamer, is_finished):
        self.is_finished = is_finished
        streamer.put(torch.zeros((len(rows), 1), dtype=torch.long))
        for step, column in enumerate(self.steps):
            if self.hang:
                self.release.wait(5)
                return
            if self.fail_at == step:
                raise RuntimeError("device fell over")
            if all(is_finished(i) for i in range(len(rows))):
                return
            streamer.put(torch.tensor(column))
            self.steps_run += 1


def sequence(tokenizer, prompt="p", **kwargs) -> Sequence:
    request = GenerationRequest(prompt=prompt, max_new_tokens=kwargs.pop("max_new_tokens", 50), **kwargs)
    return Sequence(request, tokenizer(prompt)["input_ids"], tokenizer, frozenset({EOS}))


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def run(backend, sequences, timeout=5.0):
    sent: dict[int, list[str]] = {i: [] for i in range(len(sequences))}
    index = {id(s): i for i, s in enumerate(sequences)}
    MicroBatchEngine(backend, timeout).run(sequences, lambda s, d: sent[index[id(s)]].append(d))
    return sent


def test_rows_finish_on_their_own_terms(tiny_tokenizer):
    a = ids(tiny_tokenizer, "hello world")
    b = ids(tiny_tokenizer, "the end")
    width = max(len(a), len(b)) + 1
    col_a = a + [EOS] + [0] * (width - len(a) - 1)
    col_b = (b + [0] * width)[:width]
    steps = [list(pair) for pair in zip(col_a, col_b, strict=True)]
    seqs = [sequence(tiny_tokenizer), sequence(tiny_tokenizer, max_new_tokens=len(b))]
    sent = run(ScriptedBackend(tiny_tokenizer, steps), seqs)
    assert "".join(sent[0]) == "hello world" and seqs[0].finish_reason is FinishReason.EOS
    assert seqs[0].completion_tokens == len(a) + 1  # EOS counts as generated
    assert "".join(sent[1]) == "the end" and seqs[1].finish_reason is FinishReason.LENGTH


def test_stop_string_finishes_the_row_and_tells_the_backend(tiny_tokenizer):
    tokens = ids(tiny_tokenizer, "one two three four five six seven")
    backend = ScriptedBackend(tiny_tokenizer, [[t] for t in tokens])
    seqs = [sequence(tiny_tokenizer, stop=(" three",))]
    sent = run(backend, seqs)
    assert "".join(sent[0]) == "one two"
    assert seqs[0].finish_reason is FinishReason.STOP
    assert backend.is_finished(0)  # what the backend's stopping criteria read


def test_failure_inside_generate_fails_every_row_and_returns(tiny_tokenizer):
    tokens = ids(tiny_tokenizer, "one two three four")
    seqs = [sequence(tiny_tokenizer), sequence(tiny_tokenizer)]
    sent = run(ScriptedBackend(tiny_tokenizer, [[t, t] for t in tokens], fail_at=2), seqs)
    assert all(s.state is State.FAILED for s in seqs)
    assert isinstance(seqs[0].error, EngineError) and "device fell over" in seqs[0].error.message
    assert sent[0]  # what was generated before the failure was streamed


def test_a_silent_backend_times_out_instead_of_hanging(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, [[1]], hang=True)
    seqs = [sequence(tiny_tokenizer)]
    run(backend, seqs, timeout=0.3)
    backend.release.set()
    assert seqs[0].state is State.FAILED
    assert "no token was generated" in seqs[0].error.message


def test_position_budget_exhaustion_ends_with_length(tiny_tokenizer):
    tokens = ids(tiny_tokenizer, "abc")
    seqs = [sequence(tiny_tokenizer, max_new_tokens=50)]
    run(ScriptedBackend(tiny_tokenizer, [[t] for t in tokens]), seqs)
    assert seqs[0].finish_reason is FinishReason.LENGTH
    assert seqs[0].full_text == "abc"


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_ignore_eos_keeps_generating(tiny_tokenizer, ignore_eos):
    tokens = [*ids(tiny_tokenizer, "ab"), EOS, *ids(tiny_tokenizer, "cd")]
    seqs = [sequence(tiny_tokenizer, ignore_eos=ignore_eos)]
    run(ScriptedBackend(tiny_tokenizer, [[t] for t in tokens]), seqs)
    assert seqs[0].full_text == ("abcd" if ignore_eos else "ab")


def test_on_finished_fires_once_per_row_as_it_ends(tiny_tokenizer):
    tokens = ids(tiny_tokenizer, "one two three four five six")
    seqs = [sequence(tiny_tokenizer, max_new_tokens=2), sequence(tiny_tokenizer, max_new_tokens=50)]
    finished: list[tuple[int, int]] = []  # (row, tokens the long row had when this row finished)

    def on_finished(s):
        finished.append((seqs.index(s), seqs[1].completion_tokens))

    MicroBatchEngine(ScriptedBackend(tiny_tokenizer, [[t, t] for t in tokens]), 5.0).run(
        seqs, lambda s, d: None, on_finished
    )
    assert finished == [(0, 1), (1, len(tokens))]  # the short row ended while the long one ran on
