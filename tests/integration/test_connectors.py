"""Each connector against the real sandbox over HTTP: results, reconciliation, how real
401/429/503/dropped responses are classified into StepErrors, and that ``http.call`` never
sends a connection's token to another host (a second real server counts what reaches it)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from onward.connectors import (
    Connection,
    Connector,
    CrmConnector,
    EmailConnector,
    HttpConnector,
    get_connector_class,
)
from onward.errors import (
    AuthorizationError,
    OutcomeUnknown,
    PermanentError,
    RateLimited,
    RetryableError,
)
from onward.sandbox import SandboxAdmin, SandboxServer

# connect("email", account=..., timeout=..., base_url=...) -> a connector for that provider
Connect = Callable[..., Any]

KEY = "run_81f3/step"
PARAMS: dict[str, dict[str, Any]] = {
    "email": {"from": "sam@acme.test", "to": "maya@example.test", "subject": "Hi", "body": "…"},
    "crm": {"external_id": "maya@example.test", "name": "Maya"},
    "model": {"prompt": "Draft a welcome email", "max_tokens": 32},
    "payment": {"amount": 4200, "currency": "eur", "customer": "cus_maya"},
    "slack": {"channel": "#sales", "text": "Maya signed up"},
}


pytestmark = pytest.mark.usefixtures("admin")  # every test starts on a clean sandbox


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def connect(sandbox: SandboxServer, http: httpx.AsyncClient) -> Connect:
    def make(provider: str, *, account: str = "acct_1", timeout: float = 5.0, **kw: Any) -> Any:
        connection = Connection(
            id=f"conn_{provider}_{account}",
            provider=provider,
            base_url=kw.pop("base_url", sandbox.url),
            account=account,
            token=account,
        )
        return get_connector_class(provider)(connection, client=http, timeout=timeout)

    return make


# --- registry and construction ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "idempotent", "reconcilable"),
    [
        ("email", True, True),
        ("crm", True, True),
        ("model", False, False),
        ("payment", False, False),
        ("slack", False, False),
        ("http", True, False),
    ],
)
def test_registry_and_capabilities(provider: str, idempotent: bool, reconcilable: bool) -> None:
    cls = get_connector_class(provider)

    assert issubclass(cls, Connector)
    assert cls.provider == provider
    assert cls.supports_idempotency is idempotent
    assert cls.supports_reconcile is reconcilable


def test_unknown_provider_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="fax"):
        get_connector_class("fax")


def test_connection_keeps_its_token_out_of_repr() -> None:
    connection = Connection("c1", "email", "http://x", "acct_1", token="s3cret")

    assert "s3cret" not in repr(connection)


def test_a_connector_refuses_another_providers_connection() -> None:
    with pytest.raises(ValueError, match="payment"):
        EmailConnector(Connection("c1", "payment", "http://x", "acct_1", "t"))


async def test_a_connector_closes_only_a_client_it_created(sandbox: SandboxServer) -> None:
    connection = Connection("c1", "email", sandbox.url, "acct_1", "acct_1")
    shared = httpx.AsyncClient()
    async with EmailConnector(connection) as own, EmailConnector(connection, shared) as borrowed:
        await own.probe()
        await borrowed.probe()
    assert not shared.is_closed
    await shared.aclose()


# --- perform and reconcile -------------------------------------------------------------------


async def test_email_perform_is_idempotent_and_reconcilable(
    connect: Connect, admin: SandboxAdmin
) -> None:
    email = connect("email")

    sent = await email.perform(KEY, {**PARAMS["email"], "metadata": {"campaign": "welcome"}})
    again = await email.perform(KEY, PARAMS["email"] | {"metadata": {"campaign": "welcome"}})
    found = await email.reconcile(KEY)

    assert sent["id"].startswith("msg_")
    assert sent["metadata"] == {"campaign": "welcome", "effect_key": KEY}
    assert again["id"] == sent["id"]
    assert found is not None and found["id"] == sent["id"]
    assert await email.reconcile("run_81f3/other") is None
    assert len(admin.ledger("email")) == 1


async def test_concurrent_sends_with_one_key_send_once(
    connect: Connect, admin: SandboxAdmin
) -> None:
    # Two attempts overlapping (e.g. a replacement worker racing a slow one) must not both send.
    email = connect("email")
    admin.faults("email", latency_ms=100)

    results = await asyncio.gather(*(email.perform(KEY, PARAMS["email"]) for _ in range(5)))

    assert len({r["id"] for r in results}) == 1
    assert len(admin.ledger("email")) == 1


async def test_email_recovers_a_dropped_send_by_reconciling(
    connect: Connect, admin: SandboxAdmin
) -> None:
    email = connect("email")
    admin.faults("email", script=["drop_after_work"])

    with pytest.raises(OutcomeUnknown) as caught:
        await email.perform(KEY, PARAMS["email"])
    found = await email.reconcile(KEY)
    repeated = await email.perform(KEY, PARAMS["email"])

    assert isinstance(caught.value.__cause__, httpx.RemoteProtocolError)
    [entry] = admin.ledger("email")
    assert found is not None and found["id"] == entry["response_id"]
    assert repeated["id"] == entry["response_id"]  # repeating the same key is also safe


async def test_crm_upsert_is_idempotent_and_reconcilable(
    connect: Connect, admin: SandboxAdmin
) -> None:
    crm: CrmConnector = connect("crm")

    created = await crm.perform(KEY, PARAMS["crm"])
    repeated = await crm.perform(KEY, PARAMS["crm"])
    found = await crm.reconcile(KEY)
    by_external_id = await crm.get_contact("maya@example.test")

    assert created["created"] is True
    assert repeated["created"] is False
    assert repeated["id"] == created["id"]
    assert found is not None and found["id"] == created["id"]
    assert by_external_id is not None and by_external_id["properties"]["name"] == "Maya"
    assert await crm.reconcile("run_81f3/other") is None
    assert await crm.get_contact("nobody@example.test") is None
    assert len({e["response_id"] for e in admin.ledger("crm")}) == 1


async def test_crm_uses_the_effect_key_as_external_id_by_default(connect: Connect) -> None:
    crm: CrmConnector = connect("crm")

    created = await crm.perform(KEY, {"name": "Maya"})

    assert created["external_id"] == KEY
    assert (await crm.get_contact(KEY) or {}).get("id") == created["id"]


@pytest.mark.parametrize("provider", ["model", "payment", "slack"])
async def test_non_idempotent_connectors_do_new_work_every_time(
    provider: str, connect: Connect, admin: SandboxAdmin
) -> None:
    connector = connect(provider)

    first = await connector.perform(KEY, PARAMS[provider])
    second = await connector.perform(KEY, PARAMS[provider])

    assert first["id"] and second["id"] and first["id"] != second["id"]
    entries = admin.ledger(provider)
    assert [e["response_id"] for e in entries] == [first["id"], second["id"]]
    assert {e["idempotency_key"] for e in entries} == {KEY}  # sent for tracing only
    with pytest.raises(NotImplementedError):
        await connector.reconcile(KEY)


async def test_model_and_slack_results(connect: Connect) -> None:
    generated = await connect("model").perform(KEY, PARAMS["model"])
    posted = await connect("slack").perform(KEY, PARAMS["slack"])

    assert generated["text"] and generated["cost_usd"] > 0
    assert posted["ok"] is True and posted["id"] == posted["ts"]


async def test_payment_drop_is_outcome_unknown_and_cannot_be_reconciled(
    connect: Connect, admin: SandboxAdmin
) -> None:
    payment = connect("payment")
    admin.faults("payment", script=["drop_after_work"])

    with pytest.raises(OutcomeUnknown):
        await payment.perform(KEY, PARAMS["payment"])

    assert len(admin.ledger("payment")) == 1  # charged, yet the caller cannot know
    assert not payment.supports_idempotency and not payment.supports_reconcile


async def test_generic_http_connector_sends_the_key_in_the_configured_header(
    connect: Connect, sandbox: SandboxServer, admin: SandboxAdmin
) -> None:
    generic: HttpConnector = connect("http")
    call = {
        "method": "POST",
        "path": "/email/messages",
        "json": PARAMS["email"] | {"metadata": {}},
    }

    first = await generic.perform(KEY, call)
    again = await generic.perform(KEY, call)
    # The sandbox only dedups on Idempotency-Key, so another header name is not deduped.
    other = await generic.perform(KEY, call | {"idempotency_header": "X-Request-Id"})

    assert again["id"] == first["id"]
    assert other["id"] != first["id"]
    assert len(admin.ledger("email")) == 2


async def test_generic_http_connector_takes_any_method_and_a_url_under_its_base(
    connect: Connect, sandbox: SandboxServer
) -> None:
    generic: HttpConnector = connect("http")

    by_url = await generic.perform(KEY, {"method": "GET", "url": f"{sandbox.url}/_admin/faults"})
    by_path = await generic.perform(KEY, {"method": "get", "path": "/_admin/health"})

    assert "providers" in by_url
    assert by_path["ok"] is True


# --- probe and credentials -------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["email", "crm", "model", "payment", "slack"])
async def test_probe_detects_a_revoked_account(
    provider: str, connect: Connect, admin: SandboxAdmin
) -> None:
    connector = connect(provider)
    await connector.probe()

    admin.revoke(provider, "acct_1")
    with pytest.raises(AuthorizationError) as caught:
        await connector.probe()
    with pytest.raises(AuthorizationError):
        await connector.perform(KEY, PARAMS[provider])

    assert caught.value.connection == f"conn_{provider}_acct_1"
    assert str(caught.value).startswith(f"reconnect the {provider} account acct_1")
    assert admin.ledger(provider) == []

    admin.restore(provider, "acct_1")
    await connector.probe()


async def test_generic_http_probe(
    connect: Connect, sandbox: SandboxServer, admin: SandboxAdmin
) -> None:
    generic = connect("http", base_url=f"{sandbox.url}/email")
    await generic.probe()  # GET /email/ is a 404 there, but the credentials were accepted

    admin.revoke("email", "acct_1")
    with pytest.raises(AuthorizationError):
        await generic.probe()


# --- classification of real failures ---------------------------------------------------------


async def test_real_429_becomes_rate_limited(connect: Connect, admin: SandboxAdmin) -> None:
    admin.faults("crm", script=["429"], retry_after_s=2)

    with pytest.raises(RateLimited) as caught:
        await connect("crm").perform(KEY, PARAMS["crm"])

    assert caught.value.retry_after == 2.0
    assert admin.ledger("crm") == []


async def test_real_503_becomes_retryable(connect: Connect, admin: SandboxAdmin) -> None:
    admin.faults("model", script=["503"])

    with pytest.raises(RetryableError) as caught:
        await connect("model").perform(KEY, PARAMS["model"])

    assert type(caught.value) is RetryableError
    assert caught.value.detail["status"] == 503


async def test_real_422_becomes_permanent(connect: Connect) -> None:
    with pytest.raises(PermanentError):
        await connect("payment").perform(KEY, PARAMS["payment"] | {"amount": -5})


async def test_reused_key_with_other_params_is_permanent(connect: Connect) -> None:
    email = connect("email")
    await email.perform(KEY, PARAMS["email"])

    with pytest.raises(PermanentError, match="idempotency_key_reused"):
        await email.perform(KEY, PARAMS["email"] | {"subject": "Changed"})


async def test_timeout_after_the_work_is_outcome_unknown(
    connect: Connect, admin: SandboxAdmin
) -> None:
    admin.faults("slack", script=["hang_after_work"], hang_s=30)

    with pytest.raises(OutcomeUnknown) as caught:
        await connect("slack", timeout=0.3).perform(KEY, PARAMS["slack"])

    assert isinstance(caught.value.__cause__, httpx.ReadTimeout)
    assert len(admin.ledger("slack")) == 1


async def test_a_lost_read_is_only_retryable(connect: Connect, admin: SandboxAdmin) -> None:
    admin.faults("email", script=["drop_after_work"])

    with pytest.raises(RetryableError) as caught:
        await connect("email").reconcile(KEY)

    assert type(caught.value) is RetryableError


async def test_unreachable_provider_is_retryable_not_unknown(connect: Connect) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        closed_port = placeholder.getsockname()[1]  # nothing listens here once closed

    email = connect("email", base_url=f"http://127.0.0.1:{closed_port}")
    with pytest.raises(RetryableError) as caught:
        await email.perform(KEY, PARAMS["email"])

    assert type(caught.value) is RetryableError
    assert caught.value.detail["exception"] == "ConnectError"


# --- http.call stays at the connection's base URL --------------------------------------------


class Recorder:
    """A real HTTP server on its own port that answers 200 ``{}`` and records every request
    (method, path, Authorization header)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                recorder.requests.append(
                    (self.command, self.path, self.headers.get("Authorization"))
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def elsewhere() -> Iterator[Recorder]:
    with Recorder() as server:
        yield server


def hostile_paths(base: str, other: str) -> list[str]:
    """Paths and URLs that would send the request (and the token) to ``other``, or above the
    base path of ``base``."""
    host = other.split("://", 1)[1]
    return [
        f"{other}/steal",
        f"{other.upper()}/steal",
        f"//{host}/steal",
        f"///{host}/steal",
        f"\\\\{host}/steal",
        f"/\\{host}/steal",
        f"http:{host}/steal",
        f"{base}@{host}/steal",
        f"{base}.{host}/steal",
        f"\t//{host}/steal",
        "../steal",
        "/../../steal",
        "%2e%2e/steal",
        "..%2fsteal",
        "%252e%252e%252fsteal",
        f"{base}/../steal",
    ]


async def test_http_call_sends_nothing_to_another_host_and_refuses_before_any_request(
    connect: Connect, sandbox: SandboxServer, admin: SandboxAdmin, elsewhere: Recorder
) -> None:
    base = f"{sandbox.url}/email"
    generic: HttpConnector = connect("http", base_url=base)
    body = PARAMS["email"] | {"metadata": {}}
    for path in hostile_paths(base, elsewhere.url):
        for param in ("path", "url"):
            with pytest.raises(PermanentError, match="must stay under the connection's base URL"):
                await generic.perform(KEY, {param: path, "json": body})

    assert elsewhere.requests == []  # the token never left for the other host
    assert admin.ledger("email") == []
    sent = await generic.perform(KEY, {"path": "/messages", "json": body})  # what is allowed
    assert [e["response_id"] for e in admin.ledger("email")] == [sent["id"]]
    assert elsewhere.requests == []


async def test_http_call_refuses_before_any_request_even_to_its_own_host(
    connect: Connect, elsewhere: Recorder
) -> None:
    with Recorder() as home:
        generic: HttpConnector = connect("http", base_url=f"{home.url}/api")
        for path in hostile_paths(f"{home.url}/api", elsewhere.url):
            with pytest.raises(PermanentError):
                await generic.perform(KEY, {"method": "GET", "path": path})
        assert home.requests == [] and elsewhere.requests == []

        await generic.perform(KEY, {"method": "GET", "path": "/a/../b?x=1"})
        assert home.requests == [("GET", "/api/b?x=1", "Bearer acct_1")]
        assert elsewhere.requests == []
