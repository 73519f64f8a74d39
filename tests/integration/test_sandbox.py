"""The provider sandbox over real HTTP: a real uvicorn server in a child process.

One sandbox serves the whole module (the ``sandbox`` fixture, tests/conftest.py); every test
starts from a reset world (``admin``, used by every test of the module).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from onward.sandbox import SandboxAdmin, SandboxAdminError, SandboxServer
from onward.testing import Processes, eventually_sync

EMAIL = {
    "from": "sam@acme.test",
    "to": "maya@example.test",
    "subject": "Welcome",
    "body": "Hi Maya",
    "metadata": {"effect_key": "run_81f3/send_email"},
}
CHARGE = {"amount": 4200, "currency": "EUR", "customer": "cus_maya", "description": "plan"}


pytestmark = pytest.mark.usefixtures("admin")


@pytest.fixture
def client(sandbox: SandboxServer) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=sandbox.url, timeout=5.0, headers={"Authorization": "Bearer acct_1"}
    ) as c:
        yield c


def send_email(client: httpx.Client, key: str | None = None, **changes: Any) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/email/messages", json={**EMAIL, **changes}, headers=headers)


# --- providers -------------------------------------------------------------------------------


def test_email_replay_with_the_same_key_sends_once(
    client: httpx.Client, admin: SandboxAdmin
) -> None:
    first = send_email(client, "k1")
    second = send_email(client, "k1")

    assert first.status_code == second.status_code == 200
    assert first.json()["id"].startswith("msg_")
    assert first.json()["status"] == "sent"
    assert second.json() == first.json()
    [entry] = admin.ledger("email")
    assert entry["response_id"] == first.json()["id"]
    assert entry["idempotency_key"] == "k1"
    assert entry["account"] == "acct_1"
    assert entry["op"] == "message.send"
    assert entry["metadata"] == EMAIL["metadata"]
    assert entry["request"]["to"] == "maya@example.test"
    assert {"seq", "provider", "at"} <= entry.keys()


def test_email_keys_are_scoped_per_account_and_without_a_key_every_send_counts(
    client: httpx.Client, admin: SandboxAdmin
) -> None:
    mine = send_email(client, "k1")
    theirs = client.post(
        "/email/messages",
        json=EMAIL,
        headers={"Idempotency-Key": "k1", "Authorization": "Bearer acct_2"},
    )
    send_email(client)
    send_email(client)

    assert theirs.json()["id"] != mine.json()["id"]
    assert len(admin.ledger("email")) == 4
    assert len(admin.ledger("email", account="acct_2")) == 1


def test_email_key_reused_with_a_different_request_is_refused(
    client: httpx.Client, admin: SandboxAdmin
) -> None:
    send_email(client, "k1")
    reused = send_email(client, "k1", subject="Something else")

    assert reused.status_code == 422
    assert reused.json()["error"] == "idempotency_key_reused"
    assert len(admin.ledger("email")) == 1


def test_email_search_by_metadata(client: httpx.Client) -> None:
    sent = send_email(client, "k1").json()
    send_email(client, "k2", metadata={"effect_key": "run_other/send_email"})

    found = client.get(
        "/email/messages",
        params={"metadata_key": "effect_key", "metadata_value": "run_81f3/send_email"},
    ).json()["data"]
    nothing = client.get(
        "/email/messages", params={"metadata_key": "effect_key", "metadata_value": "nope"}
    ).json()["data"]
    other_account = client.get(
        "/email/messages",
        params={"metadata_key": "effect_key", "metadata_value": "run_81f3/send_email"},
        headers={"Authorization": "Bearer acct_2"},
    ).json()["data"]

    assert found == [sent]
    assert nothing == []
    assert other_account == []


def test_crm_upsert_creates_then_updates(client: httpx.Client, admin: SandboxAdmin) -> None:
    assert client.get("/crm/contacts/maya@example.test").status_code == 404

    created = client.put("/crm/contacts/maya@example.test", json={"name": "Maya"}).json()
    updated = client.put("/crm/contacts/maya@example.test", json={"stage": "lead"}).json()
    fetched = client.get("/crm/contacts/maya@example.test")

    assert created["created"] is True
    assert updated["created"] is False
    assert updated["id"] == created["id"]
    assert created["id"].startswith("ct_")
    assert fetched.status_code == 200
    assert fetched.json()["properties"] == {"name": "Maya", "stage": "lead"}
    assert [e["op"] for e in admin.ledger("crm")] == ["contact.create", "contact.update"]


def test_crm_external_ids_may_contain_slashes_and_contacts_are_searchable(
    client: httpx.Client,
) -> None:
    created = client.put("/crm/contacts/run_81f3%2Fupsert", json={"effect_key": "k"}).json()

    assert created["external_id"] == "run_81f3/upsert"
    assert client.get("/crm/contacts/run_81f3%2Fupsert").json()["id"] == created["id"]
    found = client.get("/crm/contacts", params={"property": "effect_key", "value": "k"})
    assert [c["id"] for c in found.json()["data"]] == [created["id"]]


def test_payment_has_no_idempotency_two_calls_two_charges(
    client: httpx.Client, admin: SandboxAdmin
) -> None:
    headers = {"Idempotency-Key": "run_81f3/charge"}
    first = client.post("/payment/charges", json=CHARGE, headers=headers).json()
    second = client.post("/payment/charges", json=CHARGE, headers=headers).json()

    assert first["id"].startswith("ch_")
    assert second["id"] != first["id"]
    entries = admin.ledger("payment")
    assert [e["response_id"] for e in entries] == [first["id"], second["id"]]
    # The key is recorded (so duplicates are attributable) but never honoured.
    assert {e["idempotency_key"] for e in entries} == {"run_81f3/charge"}


def test_payment_validates_its_input(client: httpx.Client, admin: SandboxAdmin) -> None:
    assert client.post("/payment/charges", json={**CHARGE, "amount": -1}).status_code == 422
    assert admin.ledger("payment") == []


def test_model_is_deterministic_and_costs_every_call(
    client: httpx.Client, admin: SandboxAdmin
) -> None:
    prompt = {"prompt": "Draft a welcome email for Maya", "max_tokens": 64}
    first = client.post("/model/generate", json=prompt).json()
    second = client.post("/model/generate", json=prompt).json()
    other = client.post("/model/generate", json={"prompt": "Something else entirely"}).json()

    assert first["text"] == second["text"] != other["text"]
    assert first["id"] != second["id"]
    assert first["tokens_in"] > 0
    assert 0 < first["tokens_out"] <= 64
    assert first["cost_usd"] > 0
    assert len(admin.ledger("model")) == 3


def test_slack_post_message(client: httpx.Client, admin: SandboxAdmin) -> None:
    first = client.post("/slack/chat.postMessage", json={"channel": "#sales", "text": "hi"}).json()
    second = client.post(
        "/slack/chat.postMessage",
        json={"channel": "#sales", "text": "hi", "blocks": [{"type": "section"}]},
    ).json()

    assert first["ok"] is True
    assert first["channel"] == "#sales"
    assert float(second["ts"]) > float(first["ts"])
    assert [e["response_id"] for e in admin.ledger("slack")] == [first["ts"], second["ts"]]


# --- auth ------------------------------------------------------------------------------------


def test_every_provider_requires_a_bearer_token(sandbox: SandboxServer) -> None:
    with httpx.Client(base_url=sandbox.url) as anonymous:
        for provider in ("email", "crm", "model", "payment", "slack"):
            response = anonymous.get(f"/{provider}/me")
            assert response.status_code == 401, provider
            assert response.json()["error"] == "not_authed"


def test_revoke_then_restore(client: httpx.Client, admin: SandboxAdmin) -> None:
    assert client.get("/email/me").json() == {"provider": "email", "account": "acct_1"}

    admin.revoke("email", "acct_1")
    refused = send_email(client, "k1")
    other_account = client.get("/email/me", headers={"Authorization": "Bearer acct_2"})
    other_provider = client.get("/crm/me")

    assert refused.status_code == 401
    assert refused.json()["error"] == "invalid_auth"
    assert other_account.status_code == 200
    assert other_provider.status_code == 200
    assert admin.ledger("email") == []

    admin.restore("email", "acct_1")
    assert send_email(client, "k1").status_code == 200


# --- faults ----------------------------------------------------------------------------------


def test_scripted_503_refuses_before_any_work(client: httpx.Client, admin: SandboxAdmin) -> None:
    admin.faults("email", script=["503", "ok"])

    refused = send_email(client, "k1")
    assert refused.status_code == 503
    assert admin.ledger("email") == []

    assert send_email(client, "k1").status_code == 200
    assert send_email(client, "k2").status_code == 200  # script used up: back to normal
    assert len(admin.ledger("email")) == 2


def test_scripted_429_carries_retry_after(client: httpx.Client, admin: SandboxAdmin) -> None:
    admin.faults("crm", script=["429"], retry_after_s=3)

    limited = client.put("/crm/contacts/maya", json={"name": "Maya"})

    assert limited.status_code == 429
    assert limited.headers["Retry-After"] == "3"
    assert admin.ledger("crm") == []


def test_drop_after_work_does_the_work_and_drops_the_connection(
    client: httpx.Client, admin: SandboxAdmin
) -> None:
    admin.faults("email", script=["drop_after_work"])

    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        send_email(client, "k1")

    [entry] = admin.ledger("email")
    # Retrying with the same key is how a client recovers: it gets the original result.
    retried = send_email(client, "k1")
    assert retried.json()["id"] == entry["response_id"]
    assert len(admin.ledger("email")) == 1


def test_drop_after_work_on_a_provider_without_idempotency_duplicates(
    client: httpx.Client, admin: SandboxAdmin
) -> None:
    admin.faults("payment", script=["drop_after_work"])

    with pytest.raises(httpx.RemoteProtocolError):
        client.post("/payment/charges", json=CHARGE)
    retried = client.post("/payment/charges", json=CHARGE)

    assert retried.status_code == 200
    assert len(admin.ledger("payment")) == 2  # the naive retry charged twice


def test_hang_after_work_makes_the_client_time_out(
    client: httpx.Client, admin: SandboxAdmin
) -> None:
    admin.faults("payment", script=["hang_after_work"], hang_s=30)

    with pytest.raises(httpx.ReadTimeout):
        client.post("/payment/charges", json=CHARGE, timeout=0.5)

    assert len(admin.ledger("payment")) == 1


def test_latency_knob_delays_responses(client: httpx.Client, admin: SandboxAdmin) -> None:
    admin.faults("model", latency_ms=300)

    started = time.monotonic()
    response = client.post("/model/generate", json={"prompt": "hello"})

    assert response.status_code == 200
    assert time.monotonic() - started >= 0.3


def test_rates_are_reproducible_with_a_seed(client: httpx.Client, admin: SandboxAdmin) -> None:
    def statuses() -> list[int]:
        admin.faults("model", error_rate=0.3, rate_limit_rate=0.3, seed=42)
        return [client.get("/model/me").status_code for _ in range(30)]

    first = statuses()
    second = statuses()

    assert first == second
    assert {200, 429, 503} == set(first)


def test_error_rate_one_fails_everything(client: httpx.Client, admin: SandboxAdmin) -> None:
    admin.faults("slack", error_rate=1.0)

    responses = [client.post("/slack/chat.postMessage", json={"channel": "#c"}) for _ in range(5)]

    assert {r.status_code for r in responses} == {503}
    assert admin.ledger("slack") == []


def test_faults_apply_per_provider_and_script_progress_is_visible(
    client: httpx.Client, admin: SandboxAdmin
) -> None:
    admin.faults("email", script=["503", "429", "ok"])

    assert client.get("/crm/me").status_code == 200
    assert client.get("/email/me").status_code == 503
    assert admin.fault_state()["providers"]["email"]["script_remaining"] == ["429", "ok"]


def test_admin_rejects_bad_knobs(admin: SandboxAdmin) -> None:
    with pytest.raises(SandboxAdminError, match="422"):
        admin.faults("email", script=["explode"])
    with pytest.raises(SandboxAdminError, match="422"):
        admin.faults("email", error_rate=0.7, rate_limit_rate=0.7)
    with pytest.raises(SandboxAdminError, match="422"):
        admin.faults("email", latency=5)  # misspelt knob
    with pytest.raises(SandboxAdminError, match="404"):
        admin.faults("fax", error_rate=1)


def test_reset_clears_everything(client: httpx.Client, admin: SandboxAdmin) -> None:
    send_email(client, "k1")
    admin.faults("email", error_rate=1.0)
    admin.revoke("crm", "acct_1")

    admin.reset()

    assert admin.ledger() == []
    assert client.get("/crm/me").status_code == 200
    sent = send_email(client, "k1")  # same key, but the provider forgot it
    assert sent.status_code == 200
    assert len(admin.ledger("email")) == 1


# --- running the sandbox ---------------------------------------------------------------------


def test_stop_ends_the_child_process() -> None:
    server = SandboxServer().start()
    pid = server.pid
    assert pid is not None and server.admin.health()

    server.stop()

    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_thread_mode_works_as_an_async_context_manager() -> None:
    async with SandboxServer(mode="thread") as server:
        assert server.pid is None
        async with httpx.AsyncClient(base_url=server.url) as client:
            response = await client.post(
                "/email/messages", json=EMAIL, headers={"Authorization": "Bearer acct_9"}
            )
        assert response.status_code == 200
        assert len(server.admin.ledger("email", account="acct_9")) == 1
    assert not server.running


def test_cli_serves_on_the_given_port(processes: Processes) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "onward.sandbox", "--port", str(port), "--log-level", "warning"]
    process = processes.start(argv, "sandbox")
    with SandboxAdmin(f"http://127.0.0.1:{port}") as admin:

        def healthy() -> bool:
            assert process.alive(), f"the sandbox CLI exited:\n{process.tail()}"
            return admin.health()

        eventually_sync(healthy, timeout=30, what="the sandbox CLI to become healthy")
        admin.reset()
    process.stop(timeout=10)
