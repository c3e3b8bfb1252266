"""Issue 42, item 5, on the ASGI frontend: a route that names its API answers a `model` it does not
serve with a 404 `model_not_found` naming `model` (what the openai client raises as NotFoundError),
and names the served model in its responses; a body routed by its shape (SageMaker's /invocations)
is served whatever name it carries."""

from __future__ import annotations

import openai
import pytest

from tests.support.asgi_inprocess import BASE_URL, InProcessFrontend

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize("path, body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
@pytest.mark.parametrize("name", ["gpt-4", "../../etc/passwd"])
def test_an_unknown_model_is_a_404_model_not_found(frontend: InProcessFrontend, path, body, name):
    for stream in (False, True):
        response = frontend.post(path, json={**body, "model": name, "stream": stream})
        assert response.status_code == 404 and response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("model_not_found", "model")
    served = frontend.post(path, json={**body, "model": frontend.model_name})
    assert served.status_code == 200 and served.json()["model"] == frontend.model_name


def test_the_openai_client_raises_not_found_for_an_unknown_model(frontend: InProcessFrontend):
    client = openai.AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key=frontend.key, http_client=frontend.client)
    with pytest.raises(openai.NotFoundError) as caught:
        frontend.run(client.completions.create(model="gpt-4", prompt="hi", max_tokens=2))
    assert caught.value.code == "model_not_found"
    completion = frontend.run(client.completions.create(model=frontend.model_name, prompt="hi", max_tokens=2))
    assert completion.model == frontend.model_name


def test_a_body_routed_by_its_shape_is_served_whatever_model_it_names(frontend: InProcessFrontend):
    response = frontend.post("/invocations", json={**COMPLETION, "model": "whatever-the-client-says"})
    assert response.status_code == 200
