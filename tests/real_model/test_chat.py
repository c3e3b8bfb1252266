"""Chat completions on the real model: the answer is right, not only well-formed."""

from __future__ import annotations

import httpx


def chat(server, messages: list[dict[str, str]], **fields) -> dict:
    body = {"model": server.model_name, "messages": messages, "temperature": 0, **fields}
    response = httpx.post(
        f"{server.predictions_url}/1.0/v1/chat/completions", json=body, headers=server.headers, timeout=120
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_greedy_chat_knows_the_capital_of_france(real_server):
    reply = chat(real_server, [{"role": "user", "content": "What is the capital of France?"}], max_tokens=40)
    [choice] = reply["choices"]
    print(f"capital of France: {choice['message']['content']!r}")
    assert "Paris" in choice["message"]["content"], choice
    assert choice["finish_reason"] == "stop"
