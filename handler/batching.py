"""TorchServe's MicroBatching, told the batch-wide index of every request.

Streaming replies and per-request statuses are addressed by the request's index in
the frontend batch, but MicroBatching hands each stage only its slice of the batch.
(Kept out of inf2_handler.py: TorchServe wants exactly one class in the handler file.)
"""

from __future__ import annotations

from ts.handler_utils.micro_batching import MicroBatching


class IndexedMicroBatching(MicroBatching):
    def handle(self, data):
        return super().handle(list(enumerate(data)))
