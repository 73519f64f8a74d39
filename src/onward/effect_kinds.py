"""Step kinds that act on the outside world, each through the effect protocol (R4):
``email.send``, ``crm.upsert``, ``model.generate``, ``payment.charge`` and ``http.call``.

Every one names a connection (``with: {connection: mailbox}``) and passes its effect key as the
provider's idempotency key. Kinds that contact a person check consent at the moment they run
(R14): a suppressed contact's step is skipped, with the reason in the run's history. An
authorisation failure marks the connection broken and parks the run (R15).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from onward import budgets, circuits, ids, limits, signals
from onward.connections import Integrations
from onward.connectors.base import Connector
from onward.crashpoints import crash_point
from onward.errors import AuthorizationError, CircuitOpen, OutcomeUnknown, PermanentError, StepError
from onward.kinds import Advance, StepContext, reads_no_outputs, step_kind
from onward.leases import Token


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")
    connection: str


class EmailParams(_Base):
    to: str
    subject: str
    body: str
    sender: str = Field(default="onward@example.test", alias="from")
    metadata: dict[str, Any] = Field(default_factory=dict)


class CrmParams(_Base):
    external_id: str
    fields: dict[str, Any] = Field(default_factory=dict)


class ModelParams(_Base):
    prompt: str
    max_tokens: int = Field(default=256, ge=1, le=32_000)


class PaymentParams(_Base):
    amount: int = Field(ge=1)
    currency: str = "eur"
    customer: str
    description: str = ""


class HttpParams(_Base):
    path: str = "/"
    method: str = "POST"
    body: dict[str, Any] = Field(default_factory=dict)


def _integrations(step: StepContext) -> Integrations:
    if not isinstance(step.integrations, Integrations):
        raise PermanentError(
            f"step kind {step.kind} needs the engine's integrations (run it with Engine.running())"
        )
    return step.integrations


def _render(step: StepContext, value: str) -> str:
    return render_text(value, step.input, step.vars)


def render_text(value: str, input: dict[str, Any] | None, vars: dict[str, Any] | None) -> str:
    """Fill ``{input.x}`` / ``{vars.y}`` placeholders from a run's input and variables."""
    if "{" not in value:
        return value
    flat: dict[str, Any] = {}
    for root, data in (("input", input), ("vars", vars)):
        for k, v in (data or {}).items():
            flat[f"{root}.{k}"] = v
    for key, v in flat.items():
        value = value.replace("{" + key + "}", str(v))
    return value


async def run_effect(
    step: StepContext,
    connection: str,
    params: dict[str, Any],
    *,
    key: str | None = None,
    harmless_repeat: bool = False,
) -> dict[str, Any]:
    """Perform ``params`` through the connector of ``connection``, as this step's one outside
    effect (R4): the effect row is claimed under ``step.effect_key`` (the same for every
    attempt, new for every loop iteration), which is also the provider's idempotency key; a
    settled effect returns its recorded result without calling the provider; an uncertain one
    is reconciled, repeated with the same key, or parked for a person. An authorisation
    failure marks the connection broken (the customer is notified) and parks the run until it
    is restored (R15). Use it in your own step kinds with your own connectors::

        @onward.step_kind("crm.tag", lane="io")
        async def tag(step: onward.StepContext) -> dict:
            return await onward.run_effect(step, "crm", {"email": step.input["email"]})

    ``key`` names a second effect of one step (default: ``step.effect_key``; an approval's
    post uses its approval id); ``harmless_repeat`` says a repeat of an uncertain call only
    duplicates something harmless (an approval message whose buttons decide once), so it is
    repeated rather than parked for review.
    """
    integ = _integrations(step)
    # known broken: AuthorizationError (the step parks; nothing to mark). Not marked again
    # here: the customer may have restored it since it was read (the park sees that instead)
    connector, seen_at = await integ.connector_as_read(step.org_id, connection)
    try:
        return await _guarded(step, integ, connector, connection, params, key, harmless_repeat)
    except AuthorizationError as exc:
        # refused: broken, unless restored since the credentials were read
        await integ.mark_broken(step.org_id, connection, str(exc), seen_at=seen_at)
        raise


async def _guarded(
    step: StepContext,
    integ: Integrations,
    connector: Connector,
    connection: str,
    params: dict[str, Any],
    key: str | None,
    harmless_repeat: bool,
) -> dict[str, Any]:
    """The call, behind what protects the provider and the organisation (R5): the circuit of
    the provider and of the connection (open: park), the cost budget (no room: park), and the
    limits of the connection, the provider and the organisation (full: defer, no attempt
    spent). The circuit learns the call's outcome; the budget is charged what it cost."""
    pool, org = integ.pool, step.org_id
    effect_key = key or step.effect_key
    breakers = circuits.keys_for(connection, connector.provider)
    probe = await circuits.admit(pool, org, breakers, run_id=step.run_id, seq=step.seq)
    cost = connector.cost_estimate(params)
    automation = step.automation.id if step.automation else "*"
    budgeted = cost is not None and await budgets.reserve(
        pool,
        org,
        automation,
        effect_key,
        cost=cost,
        lease=integ.budget_lease,
        held=Token(org, step.run_id, step.seq, step.attempt),
    )
    try:
        limited = await limits.acquire(
            pool,
            org,
            limits.keys_for(connection, connector.provider),
            run_id=step.run_id,
            seq=step.seq,
            attempt=step.attempt,
        )
    except BaseException:
        if budgeted:
            await budgets.release(pool, org, effect_key)
        raise
    try:
        result = await integ.effects.run(
            step, connector, params, key=key, harmless_repeat=harmless_repeat
        )
    except StepError as exc:
        if budgeted and not isinstance(exc, OutcomeUnknown):
            await budgets.release(pool, org, effect_key)  # not done: nothing to charge
        if circuits.counts_as_failure(exc):
            opened = await circuits.failed(
                pool, org, breakers, run_id=step.run_id, seq=step.seq, worker=step.worker
            )
            if opened:
                raise CircuitOpen(
                    opened[0], f"circuit {opened[0]} opened by this failure: {exc}"
                ) from exc
        raise
    finally:
        if limited:
            await limits.release(pool, org, run_id=step.run_id, seq=step.seq, attempt=step.attempt)
    if budgeted:
        await budgets.charge(pool, org, automation, effect_key, cost=connector.cost_of(result))
    if probe:
        crash_point("circuit.before_close")
        await circuits.succeeded(
            pool, org, breakers, run_id=step.run_id, seq=step.seq, worker=step.worker
        )
    return result


@step_kind(
    "email.send", lane="io", params=EmailParams, contacts_person=True, reads=reads_no_outputs
)
async def email_send(step: StepContext) -> Advance:
    p: EmailParams = step.params
    to = _render(step, p.to)
    integ = _integrations(step)
    # An earlier attempt may already have sent it: then it was sent, whatever consent says now.
    prior = await integ.effects.read(step.org_id, step.effect_key)
    if prior is not None and prior["status"] == "settled":
        # the send succeeded before (a rescue): if this step probes a half-open circuit, that
        # success closes it, as it would have without the crash
        await circuits.succeeded(
            integ.pool,
            step.org_id,
            circuits.keys_for(p.connection, "email"),
            run_id=step.run_id,
            seq=step.seq,
            worker=step.worker,
        )
        return await _sent(step, integ, dict(prior["result"] or {}))
    refused = await integ.suppression(step.org_id, to, "email")
    if refused is not None:
        if prior is not None:  # an attempt began: find out whether it went out before skipping
            connector = await integ.connector(step.org_id, p.connection)
            found = (
                await connector.reconcile(step.effect_key) if connector.supports_reconcile else None
            )
            if found is not None:
                result = await integ.effects.settle_found(step, connector, found)
                return await _sent(step, integ, result)
        # an erased contact's address is not repeated into the step's output and history
        who = "the recipient" if refused.pseudonymous else to
        reason = f"{who} must not be emailed: {refused.reason} (checked at send time)"
        return Advance(output={"sent": False, "reason": reason}, skipped=reason)
    result = await run_effect(
        step,
        p.connection,
        {
            "from": p.sender,
            "to": to,
            "subject": _render(step, p.subject),
            "body": _render(step, p.body),
            "metadata": p.metadata,
        },
    )
    return await _sent(step, integ, result)


async def _sent(step: StepContext, integ: Integrations, result: dict[str, Any]) -> Advance:
    """The message went out: record its id as the correlation key a reply will carry
    (``In-Reply-To``), before the step settles -- so a settled send always has its key, and a
    reply that came first is adopted by the run (R9)."""
    message_id = result.get("id")
    if message_id:
        async with integ.pool.connection() as conn:
            await signals.correlate(
                conn,
                step.org_id,
                ids.correlation_key("email", str(message_id)),
                run_id=step.run_id,
                seq=step.seq,
                step_id=step.step_id,
            )
    return Advance(output={"sent": True, "message_id": message_id, "result": result})


@step_kind("crm.upsert", lane="io", params=CrmParams, reads=reads_no_outputs)
async def crm_upsert(step: StepContext) -> dict[str, Any]:
    p: CrmParams = step.params
    fields = {k: _render(step, v) if isinstance(v, str) else v for k, v in p.fields.items()}
    return await run_effect(
        step, p.connection, {**fields, "external_id": _render(step, p.external_id)}
    )


@step_kind("model.generate", lane="slow", params=ModelParams, reads=reads_no_outputs)
async def model_generate(step: StepContext) -> dict[str, Any]:
    p: ModelParams = step.params
    return await run_effect(
        step, p.connection, {"prompt": _render(step, p.prompt), "max_tokens": p.max_tokens}
    )


@step_kind("payment.charge", lane="io", params=PaymentParams, reads=reads_no_outputs)
async def payment_charge(step: StepContext) -> dict[str, Any]:
    p: PaymentParams = step.params
    return await run_effect(
        step,
        p.connection,
        {
            "amount": p.amount,
            "currency": p.currency,
            "customer": _render(step, p.customer),
            "description": p.description,
        },
    )


@step_kind("http.call", lane="io", params=HttpParams, reads=reads_no_outputs)
async def http_call(step: StepContext) -> dict[str, Any]:
    p: HttpParams = step.params
    return await run_effect(
        step, p.connection, {"path": p.path, "method": p.method, "json": p.body}
    )
