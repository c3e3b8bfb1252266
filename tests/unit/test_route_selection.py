"""Which wire protocol answers a request: by url_path, else (TorchServe 0.11, /invocations) by body shape."""

import pytest

from handler.api import select_api
from handler.api.native import NativeApi
from handler.api.openai import ChatCompletionsApi, CompletionsApi, ModelsApi
from handler.api.tgi import TgiApi
from handler.errors import NotFound


@pytest.mark.parametrize(
    ("url_path", "expected"),
    [("v1/completions", CompletionsApi), ("/v1/chat/completions/", ChatCompletionsApi), ("v1/models", ModelsApi)],
)
def test_a_url_path_picks_its_route_whatever_the_body(url_path, expected):
    assert type(select_api(url_path, "m", {"prompt": "native shape"})) is expected


@pytest.mark.parametrize("url_path", [None, ""])
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, ChatCompletionsApi),
        ({"messages": [{"role": "user", "content": "hi"}]}, ChatCompletionsApi),
        ({"model": "m", "prompt": "Today"}, CompletionsApi),
        ({"prompt": "Today", "max_new_tokens": 4}, NativeApi),
        ({"inputs": "Today", "parameters": {"max_new_tokens": 4}}, NativeApi),
        ("plain text prompt", NativeApi),
    ],
)
def test_without_a_url_path_the_body_shape_picks_the_route(url_path, body, expected):
    assert type(select_api(url_path, "m", body)) is expected


def test_an_unknown_url_path_is_not_found():
    with pytest.raises(NotFound) as exc:
        select_api("v2/generate", "m", {"model": "m", "prompt": "x"})
    assert exc.value.param == "url_path"


@pytest.mark.parametrize(("url_path", "streams"), [("generate", False), ("/generate_stream", True)])
def test_tgi_routes(url_path, streams):
    api = select_api(url_path, "m", None)
    assert type(api) is TgiApi and api.always_stream is streams and not api.as_list


@pytest.mark.parametrize("url_path", [None, ""])
def test_no_route_inputs_bodies_are_tgi_only_when_configured(url_path):
    hf_body = {"inputs": "Today", "parameters": {"max_new_tokens": 4}}
    assert type(select_api(url_path, "m", hf_body)) is NativeApi  # the default keeps native clients working
    api = select_api(url_path, "m", hf_body, no_route_api="tgi")
    assert type(api) is TgiApi and api.as_list
    for other in ({"prompt": "Today"}, "plain text"):
        assert type(select_api(url_path, "m", other, no_route_api="tgi")) is NativeApi
    assert type(select_api(url_path, "m", {"model": "m", "prompt": "x"}, no_route_api="tgi")) is CompletionsApi
