"""The helpers every HTTP caller uses to present an API key: ``onward.testing.api_key`` and
``auth`` (Bearer), and ``onward.api_keys.with_key`` (the key as a URL's Basic user info, for a
provider that can only be given a URL)."""

from __future__ import annotations

import httpx

from onward.api import create_app
from onward.api_keys import with_key
from onward.engine import Engine
from onward.testing import api_key, auth


def test_with_key_puts_the_key_in_the_user_info_and_keeps_the_rest() -> None:
    url = "http://127.0.0.1:8080/v1/inbound/email?x=1"
    assert with_key(url, "onw_k") == "http://onward:onw_k@127.0.0.1:8080/v1/inbound/email?x=1"
    assert with_key("https://old:pw@h.test/p", "onw_k") == "https://onward:onw_k@h.test/p"


async def test_a_key_in_the_url_and_a_bearer_key_are_each_accepted(engine: Engine) -> None:
    key = await api_key(engine, "runs:read")
    assert (await engine.keys())[0]["scopes"] == ["runs:read"]
    transport = httpx.ASGITransport(app=create_app(engine))
    async with httpx.AsyncClient(transport=transport) as client:
        anonymous = await client.get("http://onward.test/v1/runs")
        assert anonymous.status_code == 401
        in_url = await client.get(with_key("http://onward.test/v1/runs", key))
        assert in_url.status_code == 200, in_url.text
        bearer = await client.get("http://onward.test/v1/runs", headers=auth(key))
        assert bearer.status_code == 200, bearer.text
        refused = await client.post(  # the scope asked for, and no other
            "http://onward.test/v1/automations", json={"id": "x"}, headers=auth(key)
        )
        assert refused.status_code == 403


async def test_api_key_defaults_to_admin(engine: Engine) -> None:
    key = await api_key(engine)
    (row,) = await engine.keys()
    assert row["scopes"] == ["admin"] and row["key_id"] in key
