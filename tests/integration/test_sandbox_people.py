"""The sandbox's people, over real HTTP: Slack users click approval buttons, email recipients reply.

The "engine" here is a tiny real receiver (Starlette under uvicorn, in a thread): it verifies
Slack signatures with ``slack_sdk``'s own verifier, answers through the ``response_url`` the way
the engine does, and records every request byte for byte.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
import uvicorn
from slack_sdk.signature import SignatureVerifier
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from onward.sandbox import SandboxAdmin, SandboxAdminError, SandboxServer

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
WORKSPACE = "T0ACME"
APPROVAL_BLOCKS: list[dict[str, Any]] = [
    {"type": "section", "text": {"type": "mrkdwn", "text": "Refund 42 EUR to Maya?"}},
    {
        "type": "actions",
        "block_id": "onward_approval",
        "elements": [
            {
                "type": "button",
                "action_id": "approve",
                "text": {"type": "plain_text", "text": "Approve"},
                "style": "primary",
                "value": "tok_approve_81f3",
            },
            {
                "type": "button",
                "action_id": "reject",
                "text": {"type": "plain_text", "text": "Reject"},
                "style": "danger",
                "value": "tok_reject_81f3",
            },
        ],
    },
]

pytestmark = pytest.mark.usefixtures("admin")


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    valid: bool | None = None  # Slack requests: did the signature verify?

    @property
    def payload(self) -> dict[str, Any]:
        """A Slack interaction's ``payload`` form field, parsed."""
        [raw] = parse_qs(self.body.decode())["payload"]
        parsed: dict[str, Any] = json.loads(raw)
        return parsed

    @property
    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass
class Receiver:
    """A stand-in engine: records requests; answers valid clicks through their response_url."""

    url: str = ""
    requests: list[Received] = field(default_factory=list)

    def app(self) -> Starlette:
        async def interactivity(request: Request) -> JSONResponse:
            body = await request.body()
            valid = SignatureVerifier(SECRET).is_valid(
                body,
                request.headers.get("x-slack-request-timestamp"),
                request.headers.get("x-slack-signature"),
            )
            received = Received(request.url.path, dict(request.headers), body, valid)
            self.requests.append(received)
            if not valid:
                return JSONResponse({"error": "invalid_signature"}, status_code=401)
            # Like the engine: update the message through response_url before acknowledging.
            payload = received.payload
            async with httpx.AsyncClient(timeout=5) as client:
                update = await client.post(
                    payload["response_url"],
                    json={
                        "replace_original": True,
                        "text": f"{payload['actions'][0]['action_id']} by {payload['user']['id']}",
                    },
                )
            return JSONResponse({"ok": True, "update": update.json()})

        async def inbound(request: Request) -> JSONResponse:
            body = await request.body()
            self.requests.append(Received(request.url.path, dict(request.headers), body))
            return JSONResponse({"accepted": json.loads(body)["event_id"]})

        return Starlette(
            routes=[
                Route("/v1/slack/conn_1/interactivity", interactivity, methods=["POST"]),
                Route("/v1/email/inbound", inbound, methods=["POST"]),
            ]
        )

    @property
    def interactivity_url(self) -> str:
        return f"{self.url}/v1/slack/conn_1/interactivity"

    @property
    def inbound_url(self) -> str:
        return f"{self.url}/v1/email/inbound"


@pytest.fixture(scope="module")
def receiver_server() -> Iterator[Receiver]:
    receiver = Receiver()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    receiver.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(
        uvicorn.Config(receiver.app(), log_config=None, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the receiver did not start"
        time.sleep(0.01)
    yield receiver
    server.should_exit = True
    thread.join(timeout=5)
    sock.close()


@pytest.fixture
def receiver(receiver_server: Receiver) -> Receiver:
    receiver_server.requests.clear()
    return receiver_server


@pytest.fixture
def client(sandbox: SandboxServer) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=sandbox.url, timeout=5.0, headers={"Authorization": f"Bearer {WORKSPACE}"}
    ) as c:
        yield c


def post_approval(client: httpx.Client, channel: str = "C0APPROVALS") -> str:
    response = client.post(
        "/slack/chat.postMessage",
        json={"channel": channel, "text": "Refund 42 EUR to Maya?", "blocks": APPROVAL_BLOCKS},
    )
    assert response.status_code == 200
    ts: str = response.json()["ts"]
    return ts


@pytest.fixture
def approval(client: httpx.Client, admin: SandboxAdmin, receiver: Receiver) -> str:
    """A posted approval message in a workspace whose Slack app points at the receiver."""
    admin.slack_app(WORKSPACE, receiver.interactivity_url, SECRET)
    return post_approval(client)


# --- Slack clicks ------------------------------------------------------------------------------


def test_a_click_arrives_signed_with_the_buttons_value_and_the_user(
    admin: SandboxAdmin, receiver: Receiver, approval: str, sandbox: SandboxServer
) -> None:
    result = admin.click(approval, "approve", "U123", user_name="maya")

    assert result["status"] == 200
    assert result["body"]["ok"] is True
    [got] = receiver.requests
    assert got.valid is True
    assert got.headers["content-type"] == "application/x-www-form-urlencoded"
    assert got.headers["x-slack-request-timestamp"] == result["request"]["timestamp"]
    assert got.headers["x-slack-signature"] == result["request"]["signature"]
    assert got.body.decode() == result["request"]["body"]
    assert "x-slack-retry-num" not in got.headers
    payload = got.payload
    assert payload["type"] == "block_actions"
    assert payload["user"] == {"id": "U123", "username": "maya", "team_id": WORKSPACE}
    assert payload["team"] == {"id": WORKSPACE}
    assert payload["api_app_id"] == "A0SANDBOX"
    assert payload["container"] == {
        "type": "message",
        "message_ts": approval,
        "channel_id": "C0APPROVALS",
        "is_ephemeral": False,
    }
    assert payload["channel"]["id"] == "C0APPROVALS"
    assert payload["message"]["ts"] == approval
    assert payload["message"]["blocks"] == APPROVAL_BLOCKS
    assert payload["response_url"] == f"{sandbox.url}/slack/response/{approval}"
    assert payload["trigger_id"]
    [action] = payload["actions"]
    assert action["action_id"] == "approve"
    assert action["block_id"] == "onward_approval"
    assert action["value"] == "tok_approve_81f3"
    assert float(action["action_ts"]) > 0

    rejected = admin.click(approval, "reject", "U999")
    assert receiver.requests[1].valid is True
    assert receiver.requests[1].payload["actions"][0]["value"] == "tok_reject_81f3"
    assert receiver.requests[1].payload["user"]["username"] == "U999"  # defaults to the id
    assert rejected["status"] == 200


def test_response_url_updates_are_recorded_on_the_message(
    admin: SandboxAdmin, approval: str, client: httpx.Client, sandbox: SandboxServer
) -> None:
    other = post_approval(client, channel="C0OTHER")

    admin.click(approval, "approve", "U123")  # the receiver answers through response_url

    [message] = admin.slack_messages(channel="C0APPROVALS")
    assert message["ts"] == approval
    assert message["account"] == WORKSPACE
    assert message["text"] == "Refund 42 EUR to Maya?"
    assert message["blocks"] == APPROVAL_BLOCKS  # as posted: the buttons stay clickable
    assert message["updates"] == [{"replace_original": True, "text": "approve by U123"}]
    assert [m["ts"] for m in admin.slack_messages(account=WORKSPACE)] == [approval, other]
    assert admin.slack_messages(account="T0NOBODY") == []

    admin.faults("slack", error_rate=1.0)  # the fault layer stands aside for response_url
    with httpx.Client(base_url=sandbox.url) as anonymous:  # the response_url takes no token
        direct = anonymous.post(f"/slack/response/{other}", json={"text": "done"})
        expired = anonymous.post("/slack/response/1.000000", json={"text": "?"})
    assert direct.status_code == 200
    assert direct.json() == {"ok": True}
    assert admin.slack_messages(channel="C0OTHER")[0]["updates"] == [{"text": "done"}]
    assert expired.status_code == 404
    assert expired.json() == {"ok": False, "error": "expired_url"}


def test_a_forged_click_fails_verification(
    admin: SandboxAdmin, receiver: Receiver, approval: str
) -> None:
    result = admin.click(approval, "approve", "U123", forge=True)

    assert result["status"] == 401
    assert result["body"] == {"error": "invalid_signature"}
    [got] = receiver.requests
    assert got.valid is False
    assert admin.slack_messages()[0]["updates"] == []


def test_a_stale_timestamp_is_refused_though_the_signature_matches(
    admin: SandboxAdmin, receiver: Receiver, approval: str
) -> None:
    result = admin.click(approval, "approve", "U123", timestamp_offset_s=301)

    [got] = receiver.requests
    timestamp = got.headers["x-slack-request-timestamp"]
    assert abs(time.time() - 301 - int(timestamp)) < 5
    assert got.valid is False
    assert result["status"] == 401
    # Only the 5-minute window refuses it: the HMAC itself is right.
    expected = SignatureVerifier(SECRET).generate_signature(timestamp=timestamp, body=got.body)
    assert got.headers["x-slack-signature"] == expected


def test_a_reserialised_body_no_longer_matches_its_signature(
    admin: SandboxAdmin, receiver: Receiver, approval: str
) -> None:
    admin.click(approval, "approve", "U123")
    admin.click(approval, "approve", "U123", reserialise=True)

    faithful, reserialised = receiver.requests
    assert faithful.valid is True
    assert reserialised.valid is False
    # Same data, other bytes.
    assert reserialised.body != faithful.body
    assert reserialised.payload["actions"][0]["value"] == "tok_approve_81f3"
    assert reserialised.payload["user"] == faithful.payload["user"]


def test_replay_resends_the_previous_click_byte_for_byte(
    admin: SandboxAdmin, receiver: Receiver, approval: str
) -> None:
    first = admin.click(approval, "approve", "U123")
    replayed = admin.click(replay=True, account=WORKSPACE)
    by_ts = admin.click(approval, "reject", "U999", replay=True)  # other fields ignored

    original, again, again_by_ts = receiver.requests
    for copy in (again, again_by_ts):
        assert copy.body == original.body
        assert (
            copy.headers["x-slack-request-timestamp"]
            == original.headers["x-slack-request-timestamp"]
        )
        assert copy.headers["x-slack-signature"] == original.headers["x-slack-signature"]
        assert copy.valid is True  # within the window a replay verifies: only the engine can tell
    assert replayed["request"] == first["request"] == by_ts["request"]


def test_retry_num_adds_slacks_retry_headers(
    admin: SandboxAdmin, receiver: Receiver, approval: str
) -> None:
    admin.click(approval, "approve", "U123", retry_num=1)

    [got] = receiver.requests
    assert got.headers["x-slack-retry-num"] == "1"
    assert got.headers["x-slack-retry-reason"] == "http_timeout"
    assert got.valid is True


def test_clicks_that_cannot_happen_are_refused_clearly(
    admin: SandboxAdmin, receiver: Receiver, approval: str, client: httpx.Client
) -> None:
    with pytest.raises(SandboxAdminError, match=r"404.*message_not_found"):
        admin.click("1.000000", "approve", "U123")
    with pytest.raises(SandboxAdminError, match=r"422.*unknown_action"):
        admin.click(approval, "escalate", "U123")
    with pytest.raises(SandboxAdminError, match="422"):
        admin.click(approval, "approve")  # no user
    with pytest.raises(SandboxAdminError, match=r"404.*nothing_to_replay"):
        admin.click(replay=True, account=WORKSPACE)
    plain = client.post("/slack/chat.postMessage", json={"channel": "C0", "text": "hi"}).json()
    with pytest.raises(SandboxAdminError, match=r"422.*unknown_action"):
        admin.click(plain["ts"], "approve", "U123")  # a message without buttons
    elsewhere = client.post(
        "/slack/chat.postMessage",
        json={"channel": "C0", "blocks": APPROVAL_BLOCKS},
        headers={"Authorization": "Bearer T0NOAPP"},
    ).json()
    with pytest.raises(SandboxAdminError, match=r"422.*no_slack_app"):
        admin.click(elsewhere["ts"], "approve", "U123")
    assert receiver.requests == []


def test_reset_forgets_the_slack_app(
    admin: SandboxAdmin, receiver: Receiver, approval: str, client: httpx.Client
) -> None:
    admin.reset()

    with pytest.raises(SandboxAdminError, match="404"):
        admin.click(approval, "approve", "U123")
    assert admin.slack_messages() == []
    with pytest.raises(SandboxAdminError, match=r"422.*no_slack_app"):
        admin.click(post_approval(client), "approve", "U123")


def test_an_unreachable_engine_is_reported_not_raised(
    admin: SandboxAdmin, client: httpx.Client
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    admin.slack_app(WORKSPACE, f"http://127.0.0.1:{port}/interactivity", SECRET)

    result = admin.click(post_approval(client), "approve", "U123")

    assert result["status"] is None
    assert "ConnectError" in result["error"]
    assert result["request"]["signature"].startswith("v0=")


async def test_a_sandbox_in_the_engines_process_serves_response_url_during_a_click(
    receiver: Receiver,
) -> None:
    # Thread mode: the click waits for the receiver, which calls the sandbox back meanwhile.
    async with SandboxServer(mode="thread") as sandbox:
        sandbox.admin.slack_app(WORKSPACE, receiver.interactivity_url, SECRET)
        async with httpx.AsyncClient(
            base_url=sandbox.url, headers={"Authorization": f"Bearer {WORKSPACE}"}
        ) as client:
            posted = await client.post(
                "/slack/chat.postMessage", json={"channel": "C1", "blocks": APPROVAL_BLOCKS}
            )
            ts = posted.json()["ts"]
            clicked = await client.post(
                "/_admin/slack/click", json={"ts": ts, "action_id": "approve", "user": "U1"}
            )
        assert clicked.json()["status"] == 200
        assert clicked.json()["body"]["update"] == {"ok": True}
        [message] = sandbox.admin.slack_messages()
        assert message["updates"] == [{"replace_original": True, "text": "approve by U1"}]


# --- email replies -----------------------------------------------------------------------------


def send_email(client: httpx.Client, **changes: Any) -> dict[str, Any]:
    email = {
        "from": "sam@acme.test",
        "to": ["maya@example.test", "ops@example.test"],
        "subject": "Your refund",
        "body": "Shall we refund 42 EUR?",
        **changes,
    }
    response = client.post("/email/messages", json=email)
    assert response.status_code == 200
    sent: dict[str, Any] = response.json()
    return sent


def test_a_reply_is_posted_to_the_inbound_url_shaped_like_the_provider(
    admin: SandboxAdmin, receiver: Receiver, client: httpx.Client
) -> None:
    original = send_email(client)
    admin.email_inbound(WORKSPACE, receiver.inbound_url)

    result = admin.reply(original["id"], "Yes please")

    [got] = receiver.requests
    event = got.json
    assert got.headers["x-event-id"] == event["event_id"] == result["event_id"]
    assert got.headers["content-type"] == "application/json"
    assert event["event_id"].startswith("evt_")
    assert event == {
        "type": "email.received",
        "event_id": result["event_id"],
        "message_id": result["message_id"],
        "in_reply_to": original["id"],
        "from": "maya@example.test",
        "to": "sam@acme.test",
        "subject": "Re: Your refund",
        "text": "Yes please",
        "received_at": event["received_at"],
    }
    assert result["message_id"].startswith("msg_") and result["message_id"] != original["id"]
    assert result["deliveries"] == [{"status": 200, "body": {"accepted": result["event_id"]}}]

    sent, received = admin.email_messages(account=WORKSPACE)
    assert sent["id"] == original["id"] and sent["direction"] == "outbound"
    assert received["direction"] == "inbound"
    assert received["id"] == result["message_id"]
    assert received["in_reply_to"] == original["id"]
    assert received["body"] == "Yes please"
    assert received["account"] == WORKSPACE
    assert admin.email_messages(account="T0NOBODY") == []
    # Received mail is not sent mail: the provider's search and the ledger only know the send.
    assert [m["id"] for m in client.get("/email/messages").json()["data"]] == [original["id"]]
    assert len(admin.ledger("email")) == 1


def test_duplicate_deliveries_send_the_same_event(
    admin: SandboxAdmin, receiver: Receiver, client: httpx.Client
) -> None:
    original = send_email(client, subject="Re: Your refund")
    admin.email_inbound(WORKSPACE, receiver.inbound_url)

    result = admin.reply(
        original["id"], "Stop", sender="boss@example.test", event_id="evt_fixed", deliveries=3
    )

    assert len(result["deliveries"]) == 3
    assert {d["status"] for d in result["deliveries"]} == {200}
    bodies = [r.body for r in receiver.requests]
    assert len(bodies) == 3 and len(set(bodies)) == 1
    assert [r.headers["x-event-id"] for r in receiver.requests] == ["evt_fixed"] * 3
    event = receiver.requests[0].json
    assert event["event_id"] == "evt_fixed"
    assert event["from"] == "boss@example.test"
    assert event["subject"] == "Re: Your refund"  # not "Re: Re: ..."
    assert len(admin.email_messages(account=WORKSPACE)) == 2  # one reply, however delivered


def test_an_unsubscribe_is_its_own_event_type(
    admin: SandboxAdmin, receiver: Receiver, client: httpx.Client
) -> None:
    original = send_email(client, to="maya@example.test")
    admin.email_inbound(WORKSPACE, receiver.inbound_url)

    admin.reply(original["id"], kind="unsubscribe")

    [got] = receiver.requests
    assert got.json["type"] == "email.unsubscribed"
    assert got.json["in_reply_to"] == original["id"]
    assert got.json["from"] == "maya@example.test"


def test_replies_that_cannot_happen_are_refused_clearly(
    admin: SandboxAdmin, receiver: Receiver, client: httpx.Client
) -> None:
    with pytest.raises(SandboxAdminError, match=r"404.*message_not_found"):
        admin.reply("msg_nope", "hello")
    original = send_email(client)
    with pytest.raises(SandboxAdminError, match=r"422.*no_inbound_url"):
        admin.reply(original["id"], "hello")  # nobody told the sandbox where replies go
    with pytest.raises(SandboxAdminError, match="422"):
        admin.reply(original["id"], "hello", kind="forward")
    assert receiver.requests == []
