"""The TorchServe adapter: the only package (with handler/inf2_handler.py) that imports `ts`
or reads TorchServe's context. Both scheduling modes (continuous.py, static.py), what they
share (service.py), the failed-start worker, drain, metrics and the 0.11 / 0.12 differences."""
