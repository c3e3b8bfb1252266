"""TorchServe's MicroBatching, told the batch-wide index of every request.

Streaming replies and per-request statuses are addressed by the request's index in
the frontend batch, but MicroBatching hands each stage only its slice of the batch.
(Kept out of inf2_handler.py: TorchServe wants exactly one class in the handler file.)
"""

from __future__ import annotations

import logging

from ts.handler_utils.micro_batching import MicroBatching

logger = logging.getLogger(__name__)


class IndexedMicroBatching(MicroBatching):
    def handle(self, data):
        request_ids = getattr(self.handler.context, "request_ids", None) or {}
        logger.info(
            "frontend batch of %d request(s): %s",
            len(data),
            ",".join(request_ids.get(i, "?") for i in range(len(data))),
        )
        return super().handle(list(enumerate(data)))
