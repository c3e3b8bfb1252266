"""Which wire protocol answers a request: by url_path (the route table, handler/api/routes.py), else
(TorchServe 0.11, /invocations) by body shape."""

import pytest

from handler.api import select_api, select_embedding_api
from handler.api.native import NativeApi
from handler.api.openai import ChatCompletionsApi, CompletionsApi, ModelsApi
from handler.api.routes import BY_NAME, ID_PARAM, ROUTES, Route, match
from handler.api.tgi import TgiApi
from handler.errors import InvalidRequest, NotFound


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


# -- the route table (handler/api/routes.py) --------------------------------------------
@pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])
def test_each_route_of_the_table_gets_its_declared_api(route: Route):
    for url_path in (route.name, f"/{route.name}/"):
        if "generate" in route.tasks:
            api = select_api(url_path, "m", None)
        else:
            with pytest.raises(InvalidRequest) as refused:
                select_api(url_path, "m", None)
            assert refused.value.param == "url_path" and "handler.task: embed" in refused.value.message
        if "embed" in route.tasks:
            api = select_embedding_api(url_path, "m", 384)
        else:
            with pytest.raises(InvalidRequest) as refused:
                select_embedding_api(url_path, "m", 384)
            assert refused.value.param == "url_path" and "handler.task: generate" in refused.value.message
        assert type(api) is route.api
        assert all(getattr(api, key) == value for key, value in route.options.items())


def test_the_table_is_well_formed():
    assert len({r.name for r in ROUTES}) == len(ROUTES)
    paths = [path for r in ROUTES for path in r.paths]
    assert len(set(paths)) == len(paths) and all(path.startswith("/") for path in paths)
    for route in ROUTES:
        assert route.name == route.name.strip("/") and set(route.methods) <= {"GET", "POST", "DELETE"}
        assert route.body or "GET" in route.methods, route.name  # a route without a body takes GET
        assert route.with_id == any(ID_PARAM in path for path in route.paths), route.name
        assert route.tasks and route.label


@pytest.mark.parametrize("model_id", ["m", "org/m", "other"])
def test_a_route_with_an_id_passes_it_on(model_id: str):
    for select in (lambda p: select_api(p, "m"), lambda p: select_embedding_api(p, "m", 384)):
        api = select(f"v1/models/{model_id}")
        assert type(api) is ModelsApi and api.model_id == model_id
    assert match(f"v1/models/{model_id}") == (BY_NAME["v1/models"], model_id)
    assert match(f"v1/completions/{model_id}") == (None, None)  # only a route `with_id` takes one


@pytest.mark.parametrize("url_path", ["v2/generate", "v1", "v1/completion", "generate/x"])
def test_unknown_routes_are_not_found_on_either_archive(url_path: str):
    with pytest.raises(NotFound):
        select_api(url_path, "m", {"prompt": "x"})
    with pytest.raises(NotFound):
        select_embedding_api(url_path, "m", 384, {"input": "x"})
