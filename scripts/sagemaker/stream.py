"""Stream a completion from a SageMaker endpoint and print the text as it arrives.

`invoke_endpoint_with_response_stream` hands back the container's response as event
payloads of arbitrary size: one NDJSON line may be split across payloads, and so may
one multi-byte UTF-8 character. `LineAssembler` buffers bytes and gives out whole
lines only, so every line is complete JSON and complete UTF-8.

    python -m scripts.sagemaker.stream --endpoint-name inf2-llm-20261130-120000 "Today the weather is"
    python -m scripts.sagemaker.stream --url http://127.0.0.1:8080 "Today the weather is"   # local container

The body is the native request (`{"prompt", "max_new_tokens", "stream": true}`) sent to
`/invocations`; `--plain` sends the prompt as bare text, as the seed's client does.

Errors end the command with `error: <code>: <message>` on stderr and exit status 1: an
error event in the stream (botocore raises ModelStreamError / InternalStreamFailure as
`EventStreamError` while iterating), a refused call (ModelError, with the container's status
and message), an error line from the handler, or a lost connection.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from botocore.exceptions import BotoCoreError, ClientError
from urllib3.exceptions import HTTPError


class StreamError(RuntimeError):
    """The endpoint reported an error (in the stream or instead of it), or the connection failed."""


class LineAssembler:
    """Bytes in, whole decoded lines out, whatever the payload boundaries."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        *lines, rest = bytes(self._buffer).split(b"\n")
        self._buffer = bytearray(rest)
        return [line.decode("utf-8").removesuffix("\r") for line in lines]

    def flush(self) -> list[str]:
        """The last line when the stream did not end with a newline."""
        rest, self._buffer = bytes(self._buffer), bytearray()
        return [rest.decode("utf-8").removesuffix("\r")] if rest.strip() else []


def _client_error_message(exc: ClientError) -> str:
    """`Code: message` from a botocore ClientError (EventStreamError included), ModelError's detail too."""
    error = exc.response.get("Error", {})
    message = f"{error.get('Code', 'Error')}: {error.get('Message', '')}".strip()
    original = exc.response.get("OriginalMessage")
    status = exc.response.get("OriginalStatusCode")
    if original or status:
        message += f" (container answered {status}: {original})"
    return message


def sagemaker_payloads(runtime: Any, endpoint_name: str, body: bytes, content_type: str) -> Iterator[bytes]:
    """The PayloadPart bytes of invoke_endpoint_with_response_stream, in order.

    botocore raises an error event (ModelStreamError, InternalStreamFailure) as
    `EventStreamError` while the stream is iterated; it and any failure of the call itself
    become a StreamError with the service's code and message.
    """
    try:
        response = runtime.invoke_endpoint_with_response_stream(
            EndpointName=endpoint_name, Body=body, ContentType=content_type, Accept="application/x-ndjson"
        )
        for event in response["Body"]:
            part = event.get("PayloadPart")
            if part is not None:
                yield part.get("Bytes", b"")
    except ClientError as exc:  # EventStreamError is one
        raise StreamError(_client_error_message(exc)) from None
    except (BotoCoreError, HTTPError) as exc:  # no credentials, connection lost, read timeout mid-stream
        raise StreamError(f"{type(exc).__name__}: {exc}") from None


def http_payloads(url: str, body: bytes, content_type: str) -> Iterator[bytes]:
    """The same bytes straight from a container's /invocations (a local `make sagemaker-local`)."""
    import httpx

    try:
        with httpx.stream(
            "POST", f"{url.rstrip('/')}/invocations", content=body, headers={"Content-Type": content_type}, timeout=600
        ) as response:
            if response.status_code != 200:
                raise StreamError(f"HTTP {response.status_code}: {response.read().decode('utf-8', 'replace')}")
            yield from response.iter_raw()
    except httpx.HTTPError as exc:
        raise StreamError(f"{type(exc).__name__}: {exc}") from None


def _record(line: str) -> dict[str, Any] | None:
    """One NDJSON line (or an SSE `data:` line) as a dict; None for blank lines and [DONE]."""
    line = line.strip()
    if line.startswith("data:"):
        line = line[len("data:") :].strip()
    if not line or line == "[DONE]":
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        raise StreamError(f"not a JSON line: {line[:200]!r}") from None
    if not isinstance(record, dict):
        raise StreamError(f"not a JSON object: {line[:200]!r}")
    if record.get("error"):
        error = record["error"]
        raise StreamError(error.get("message", str(error)) if isinstance(error, dict) else str(error))
    return record


def _text(record: dict[str, Any]) -> str:
    if "text" in record:
        return record["text"] or ""
    choices = record.get("choices") or [{}]  # an OpenAI-style chunk
    return choices[0].get("text") or (choices[0].get("delta") or {}).get("content") or ""


def stream_text(payloads: Iterable[bytes], out: TextIO) -> dict[str, Any]:
    """Write the text to `out` as it arrives; return the last record (finish_reason, usage)."""
    assembler = LineAssembler()
    last: dict[str, Any] = {}

    def emit(lines: list[str]) -> None:
        nonlocal last
        for line in lines:
            record = _record(line)
            if record is not None:
                out.write(_text(record))
                out.flush()
                last = record

    for payload in payloads:
        emit(assembler.feed(payload))
    emit(assembler.flush())
    return last


def request_body(prompt: str, max_new_tokens: int, plain: bool) -> tuple[bytes, str]:
    if plain:
        return prompt.encode("utf-8"), "text/plain"
    body = {"prompt": prompt, "max_new_tokens": max_new_tokens, "stream": True}
    return json.dumps(body, ensure_ascii=False).encode("utf-8"), "application/json"


def _payloads(args: argparse.Namespace, body: bytes, content_type: str, runtime: Any) -> Iterator[bytes]:
    if args.url is not None:
        yield from http_payloads(args.url, body, content_type)
        return
    if runtime is None:
        import boto3

        try:
            runtime = boto3.client("sagemaker-runtime", region_name=args.region)
        except BotoCoreError as exc:  # e.g. no region configured
            raise StreamError(f"{type(exc).__name__}: {exc}") from None
    yield from sagemaker_payloads(runtime, args.endpoint_name, body, content_type)


def main(argv: list[str] | None = None, runtime: Any = None) -> None:
    """Exit status 0 when the stream ended normally, 1 with `error: ...` on stderr otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--endpoint-name", help="a SageMaker endpoint (invoke_endpoint_with_response_stream)")
    target.add_argument("--url", help="a container's base URL, e.g. http://127.0.0.1:8080 (POST /invocations)")
    parser.add_argument("prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--plain", action="store_true", help="send the prompt as plain text (server defaults)")
    parser.add_argument("--region", default=None)
    args = parser.parse_args(argv)
    body, content_type = request_body(args.prompt, args.max_new_tokens, args.plain)
    try:
        last = stream_text(_payloads(args, body, content_type, runtime), sys.stdout)
    except StreamError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print()
    if last.get("finish_reason"):
        print(f"[finish_reason={last['finish_reason']} usage={json.dumps(last.get('usage'))}]", file=sys.stderr)


if __name__ == "__main__":
    main()
