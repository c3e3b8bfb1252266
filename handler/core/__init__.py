"""The context-free serving core both frontends share: loading the model, turning one request
(its route, headers and body) into engine `Sequence`s or the error or reply it gets instead,
and the request-level checks. No TorchServe here (handler/serving/ adapts it to TorchServe's
worker protocol, handler/frontend/ to ASGI)."""
