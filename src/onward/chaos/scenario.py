"""The reference scenario as the chaos runner drives it: Maya's follow-up, with what exists.

    wait (wait_for 1s) -> draft (model.generate) -> crm (crm.upsert) -> send (email.send)
        -> pay? (branch on input.charge) -> charge (payment.charge) -> done (set)
                                         \\-> done

Every outside effect goes to the sandbox over real HTTP through a registered connection, so the
sandbox ledger is the record of the work the providers really did. One run in
``CHARGE_EVERY`` also charges a card at the payment provider, which offers neither an
idempotency key nor a search: an uncertain charge must park for a person, never repeat.

Each run is started by a webhook-like event id (``evt-<i>``), delivered twice.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from onward.automations.builder import Automation
from onward.connections import Integrations
from onward.sandbox.admin import SandboxAdmin

AUTOMATION = "chaos-follow-up"
ACCOUNT = "acct_chaos"
CHARGE_EVERY = 5  # one run in five charges a card

# connection id -> provider
CONNECTIONS = {"model": "model", "crm": "crm", "mailbox": "email", "payments": "payment"}
# the effect steps of the scenario -> their provider
EFFECT_STEPS = {"draft": "model", "crm": "crm", "send": "email", "charge": "payment"}
IDEMPOTENT_PROVIDERS = ("email", "crm")  # a repeat is harmless: duplicates must be 0

# Generous attempts: every kill of a claimed step costs one attempt (the claim is the fence).
RETRY = {"max_attempts": 40, "base": 0.2, "cap": 2.0}


def event_id(i: int) -> str:
    return f"evt-{i}"


def payload(i: int) -> dict[str, Any]:
    return {
        "i": i,
        "email": f"maya+{i}@example.test",
        "contact": f"contact-{i}",
        "charge": i % CHARGE_EVERY == 0,
    }


def charges(runs: int) -> int:
    """How many of ``runs`` runs (events 0..runs-1) reach the payment step."""
    return sum(1 for i in range(runs) if payload(i)["charge"])


# A schedule beside the scenario, so the elected sweeper fires runs while it is killed (crash
# point schedule.after_start). Its runs live in an organisation of their own: the scenario's
# figures stay the scenario's.
CLOCK_ORG = "chaos-clock"
CLOCK = "chaos-clock"
CLOCK_EVERY_S = 3
CLOCK_FIRINGS = 200  # ten minutes of firings; a COUNT keeps each calendar step cheap


def clock_document() -> dict[str, Any]:
    """An automation started every few seconds by its schedule (overlap allow, catch-up all:
    every instant must start exactly one run, whatever was killed)."""
    first = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    rule = (
        f"DTSTART:{first:%Y%m%dT%H%M%S}\n"
        f"RRULE:FREQ=SECONDLY;INTERVAL={CLOCK_EVERY_S};COUNT={CLOCK_FIRINGS}"
    )
    flow = (
        Automation(CLOCK)
        .step("tick", "set", values={"at": "input.schedule.instant"})
        .schedule("tick", rule, zone="UTC", overlap="allow", catch_up="all")
    )
    return flow.build()


def document(wait: str = "1s") -> dict[str, Any]:
    flow = (
        Automation(AUTOMATION, name="Maya's follow-up (chaos)")
        .step("wait", "wait_for", duration=wait)
        .step(
            "draft",
            "model.generate",
            connection="model",
            prompt="Draft a short follow-up to {input.email}",
            max_tokens=64,
        )
        .step(
            "crm",
            "crm.upsert",
            connection="crm",
            external_id="{input.contact}",
            fields={"email": "{input.email}", "stage": "contacted"},
        )
        .step(
            "send",
            "email.send",
            connection="mailbox",
            to="{input.email}",
            subject="Following up",
            body="Hello {input.email}, thanks for your message.",
        )
        .branch("pay", cases=[("input.charge == true", "charge")], default="done")
        .step(
            "charge",
            "payment.charge",
            connection="payments",
            amount=1200,
            currency="eur",
            customer="{input.contact}",
            description="follow-up package",
            next="done",
        )
        .step("done", "set", values={"finished": "true"})
    )
    doc = flow.build()
    for step in doc["steps"]:
        step["retry"] = dict(RETRY)
    return doc


async def add_connections(integrations: Integrations, org_id: str, sandbox_url: str) -> None:
    """One connection per provider, all on the sandbox's chaos account."""
    for connection_id, provider in CONNECTIONS.items():
        await integrations.add_connection(
            org_id,
            connection_id,
            provider=provider,
            base_url=sandbox_url,
            account=ACCOUNT,
            secret=ACCOUNT,  # the sandbox's bearer token names the account
        )


def fault_knobs(seed: int, *, light: bool = True) -> dict[str, dict[str, Any]]:
    """A little of every provider failure the design names, on top of the kills.

    5xx and 429 are answers ("not done"): the attempt is withdrawn and retried. A dropped
    connection after the work is an unknown outcome: reconciled (email, CRM) or parked for a
    person (payment). The model gets no dropped responses: it has neither idempotency nor
    search, so an unknown generation parks too, and the kills already exercise that."""
    if not light:
        return {}
    knobs: dict[str, dict[str, Any]] = {}
    for n, provider in enumerate(("email", "crm", "model", "payment")):
        k: dict[str, Any] = {
            "error_rate": 0.02,
            "rate_limit_rate": 0.01,
            "retry_after_s": 1,
            "seed": seed + n,
        }
        if provider != "model":
            k["drop_after_work_rate"] = 0.01
        knobs[provider] = k
    return knobs


def configure_faults(admin: SandboxAdmin, knobs: dict[str, dict[str, Any]]) -> None:
    admin.reset()
    for provider, k in knobs.items():
        admin.faults(provider, **k)
