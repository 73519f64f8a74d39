"""Approvals (R10): a person decides, in Slack or through the API, and the run goes on.

The ``approval`` step kind (wait lane) renders the content to approve, opens a *request*
(``approvals`` row: the content's sha256 digest, who is asked, a deadline, a nonce) and posts a
Slack message with Approve / Reject buttons through the Slack connection, as an effect whose key
is the approval id (``ids.approval_id``: a retry never posts twice). Then the step waits, with
the deadline as its timer.

* **Tokens.** Each button carries a token signed with the engine's secret (``itsdangerous``,
  salt ``onward.approval``), bound to the organisation, run, step entry, approval, content
  digest, the request's nonce and the decision it makes, and short-lived: it expires with its
  request's deadline. It is single-use: the first decision moves the request off ``pending``
  in the transaction that wakes the step, so any later token of that request decides nothing.
* **Permission at click time.** The clicker must be among the request's approvers *and* hold a
  live grant in ``approvers`` when the button is pressed; a revoked approver is refused.
* **First decision wins.** A second decision (another approver, another channel, the same
  person twice, a Slack retry) reads the first back.
* **Content binds.** At decision time the content is rendered again from the run as it is
  now; if its digest differs from the request's, the request is superseded, the click refused,
  and the step asks again with the new content (new request, new buttons).
* **Deadlines.** When the deadline timer fires first, the request expires and the step applies
  its policy: ``escalate`` (a new request to ``escalate_to``), ``default`` (decide
  ``default``), or ``stop`` (park the run for a person, visibly).
* **Order.** A decision takes the run's transition lock (``signals.lock_run``), then the request and its
  unfired deadline timer (``approvals.sql lock``); the settle that makes the step wait locks
  the run too and wakes the step at once if a decision came first (:func:`wake_if_decided`).
"""

from __future__ import annotations

import hashlib
import secrets as pysecrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from itsdangerous import BadSignature, URLSafeSerializer
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from onward import audit, ids, signals, vault
from onward.automations.document import StepDef
from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.durations import parse_duration
from onward.effect_kinds import _integrations, render_text, run_effect
from onward.errors import DecisionRefused, InvalidInput, NeedsReview, UnknownApproval
from onward.inputs import check_text
from onward.kinds import Advance, StepContext, Wait, reads_no_outputs, step_kind

Q = Queries(__package__, "approvals.sql")

DECISIONS = {"approve": "approved", "reject": "rejected"}
TOKEN_SALT = "onward.approval"
SECRET_NAME = "approval_tokens"
SECRET_PURPOSE = "engine_secrets.approval_tokens"  # kept encrypted (onward.vault)
MAX_CONTENT = 3000  # Slack's section text limit


def digest_of(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


# -- the secret and the tokens -----------------------------------------------------------------


async def token_secret(pool: Pool, configured: str | None = None) -> str:
    """The key that signs approval tokens: ``ONWARD_SIGNING_SECRET`` when set, else one the
    engine made for itself and keeps in the database (every process reads the same)."""
    if configured:
        return configured
    for _ in range(2):  # a concurrent first creation is read on the second try
        async with pool.connection() as conn:
            made = await vault.seal(conn, "_system", SECRET_PURPOSE, pysecrets.token_urlsafe(32))
            row = await (
                await conn.execute(Q.secret, {"name": SECRET_NAME, "secret": made})
            ).fetchone()
            if row is not None:
                return await vault.unseal(conn, "_system", SECRET_PURPOSE, row["secret"])
    raise RuntimeError("the approval secret could not be read")


@dataclass(frozen=True)
class Token:
    """What a button's token says (verified: it was signed with the engine's secret)."""

    org_id: str
    approval_id: str
    run_id: str
    seq: int
    digest: str
    nonce: str
    decision: str  # 'approved' | 'rejected'
    expires: float  # unix time: the request's deadline


def mint(secret: str, org_id: str, request: dict[str, Any], decision: str) -> str:
    """The token of one button of one request."""
    return str(
        URLSafeSerializer(secret, salt=TOKEN_SALT).dumps(
            {
                "o": org_id,
                "a": request["approval_id"],
                "r": request["run_id"],
                "s": request["seq"],
                "d": request["digest"],
                "n": request["nonce"],
                "v": decision,
                "x": request["deadline_at"].timestamp(),
            }
        )
    )


def read_token(secret: str, token: str) -> Token:
    """Verify a token's signature; ``DecisionRefused`` (``invalid_token``) if it does not
    hold."""
    try:
        raw = URLSafeSerializer(secret, salt=TOKEN_SALT).loads(token)
        parsed = Token(
            org_id=str(raw["o"]),
            approval_id=str(raw["a"]),
            run_id=str(raw["r"]),
            seq=int(raw["s"]),
            digest=str(raw["d"]),
            nonce=str(raw["n"]),
            decision=str(raw["v"]),
            expires=float(raw["x"]),
        )
    except (BadSignature, KeyError, TypeError, ValueError):
        raise DecisionRefused("invalid_token", "this button's token is not valid") from None
    return parsed  # its expiry is the request's deadline, checked by the database's clock


# -- requests --------------------------------------------------------------------------------


async def latest(pool: Pool, org_id: str, run_id: str, seq: int) -> dict[str, Any] | None:
    """The newest request of a step entry."""
    async with pool.connection() as conn:
        row: dict[str, Any] | None = await (
            await conn.execute(Q.latest, {"org_id": org_id, "run_id": run_id, "seq": seq})
        ).fetchone()
        return row


async def get(pool: Pool, org_id: str, approval_id: str) -> dict[str, Any]:
    async with pool.connection() as conn:
        row: dict[str, Any] | None = await (
            await conn.execute(Q.get, {"org_id": org_id, "approval_id": approval_id})
        ).fetchone()
    if row is None:
        raise UnknownApproval(org_id, approval_id)
    return row


async def list_approvals(
    pool: Pool,
    org_id: str,
    *,
    run_id: str | None = None,
    status: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            Q.list, {"org_id": org_id, "run_id": run_id, "status": status, "limit": limit}
        )
        return list(await cur.fetchall())


async def open_request(
    pool: Pool,
    step: StepContext,
    *,
    request: int,
    content: str,
    approvers: list[str],
    channel: str | None,
    deadline_s: float,
) -> dict[str, Any]:
    """Open request number ``request`` of this step entry (superseding a pending one);
    idempotent by its approval id."""
    approval_id = ids.approval_id(step.run_id, step.step_id, step.iteration, request)
    async with pool.connection() as conn:
        row = await (
            await conn.execute(
                Q.open,
                {
                    "org_id": step.org_id,
                    "approval_id": approval_id,
                    "run_id": step.run_id,
                    "seq": step.seq,
                    "step_id": step.step_id,
                    "request": request,
                    "digest": digest_of(content),
                    "content": content,
                    "approvers": approvers,
                    "channel": channel,
                    "nonce": pysecrets.token_urlsafe(12),
                    "deadline_s": deadline_s,
                    "worker": step.worker,
                },
            )
        ).fetchone()
    assert row is not None
    return {**row, "run_id": step.run_id, "seq": step.seq}


async def expire(pool: Pool, org_id: str, approval_id: str, *, policy: str, worker: str) -> bool:
    async with pool.connection() as conn:
        row = await (
            await conn.execute(
                Q.expire,
                {"org_id": org_id, "approval_id": approval_id, "policy": policy, "worker": worker},
            )
        ).fetchone()
    return bool(row and row["expired"])


async def wake_if_decided(conn: Conn, org_id: str, run_id: str, seq: int, *, worker: str) -> bool:
    """In the settle's transaction, with the run's transition lock held: a decision (or a superseding
    change) that came before the step began waiting wakes it now."""
    row = await (
        await conn.execute(Q.latest, {"org_id": org_id, "run_id": run_id, "seq": seq})
    ).fetchone()
    if row is None or row["status"] not in ("approved", "rejected", "superseded"):
        return False
    woke = await _settle(conn, org_id, row["approval_id"], None, None, None, worker)
    return bool(woke["woken"])


async def cancel_pending(conn: Conn, org_id: str, run_id: str) -> list[str]:
    """The run was cancelled (in the caller's transaction, under the run's transition lock):
    its pending request becomes ``cancelled``; a later decision is refused as cancelled."""
    rows = await (
        await conn.execute(Q.cancel_pending, {"org_id": org_id, "run_id": run_id})
    ).fetchall()
    return [r["approval_id"] for r in rows]


async def _settle(
    conn: Conn,
    org_id: str,
    approval_id: str,
    status: str | None,
    decided_by: str | None,
    via: str | None,
    worker: str,
) -> dict[str, Any]:
    row = await (
        await conn.execute(
            Q.settle,
            {
                "org_id": org_id,
                "approval_id": approval_id,
                "status": status,
                "decided_by": decided_by,
                "via": via,
                "worker": worker,
            },
        )
    ).fetchone()
    assert row is not None
    return dict(row)


# -- deciding ----------------------------------------------------------------------------------


#: Renders the content a request shows, from its run as it is now (None: cannot tell).
ContentNow = Callable[[dict[str, Any]], Awaitable[str | None]]


def _read_back(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "approval_id": row["approval_id"],
        "status": row["status"],
        "decided_by": row.get("decided_by"),
        "decided_via": row.get("decided_via"),
        "decided_at": row.get("decided_at"),
    }


async def decide(
    pool: Pool,
    org_id: str,
    approval_id: str,
    decision: str,
    *,
    user: str,
    via: str,
    content_now: ContentNow,
    worker: str,
    token: Token | None = None,
) -> dict[str, Any]:
    """Record ``decision`` (``approved`` / ``rejected``) by ``user`` if it is the first, the
    request is still open, ``user`` may decide now and the content is unchanged -- waking the
    step in the same transaction. Else ``DecisionRefused`` with the reason (recorded in the
    run's history) and the decision that stands, if any. ``token``: the button's, checked
    against the request it names."""
    if decision not in DECISIONS.values():
        raise InvalidInput(f"decision: approve or reject, not {decision!r}")
    check_text(user, "user")
    request = await get(pool, org_id, approval_id)
    if token is not None and (
        token.org_id != org_id
        or (token.run_id, token.seq) != (request["run_id"], request["seq"])
        or token.nonce != request["nonce"]
        or token.digest != request["digest"]
    ):
        await _refused(pool, org_id, approval_id, user, "invalid_token", via, worker)
        raise DecisionRefused("invalid_token", "this button does not belong to this request")
    now_content = (
        await content_now(request) if request["status"] == "pending" else request["content"]
    )
    async with pool.connection() as conn, conn.transaction():
        await signals.lock_run(conn, org_id, request["run_id"])
        locked = await (
            await conn.execute(Q.lock, {"org_id": org_id, "approval_id": approval_id})
        ).fetchone()
        assert locked is not None
        current = await (
            await conn.execute(Q.get, {"org_id": org_id, "approval_id": approval_id})
        ).fetchone()
        assert current is not None
        refusal = _why_not(current, locked, decision, user)
        if refusal is None and not await _permitted(conn, org_id, user, current):
            refusal = (
                "not_permitted",
                f"{user} may not decide this request (not asked, or permission revoked)",
            )
        if (
            refusal is None
            and now_content is not None
            and digest_of(now_content) != (current["digest"])
        ):
            await _settle(conn, org_id, approval_id, "superseded", user, via, worker)
            refusal = (
                "superseded",
                "the content changed since this request was sent; a new request was posted",
            )
        if refusal is None:
            await _settle(conn, org_id, approval_id, decision, user, via, worker)
            crash_point("approval.after_decide")
            decided = await (
                await conn.execute(Q.get, {"org_id": org_id, "approval_id": approval_id})
            ).fetchone()
            assert decided is not None
            return _read_back(decided)
    reason, message = refusal
    if reason != "decided":
        await _refused(pool, org_id, approval_id, user, reason, via, worker)
    stands = _read_back(current) if current["status"] in DECISIONS.values() else None
    raise DecisionRefused(reason, message, stands)


def _why_not(
    current: dict[str, Any], locked: dict[str, Any], decision: str, user: str
) -> tuple[str, str] | None:
    status = current["status"]
    if status in DECISIONS.values():
        same = current["decided_by"] == user and status == decision
        verb = "you" if same else current["decided_by"]
        return ("decided", f"already {status} by {verb} at {current['decided_at']:%Y-%m-%d %H:%M}")
    if status == "expired" or (status == "pending" and locked["past_deadline"]):
        return ("expired", f"this request expired at {current['deadline_at']:%Y-%m-%d %H:%M} UTC")
    if status == "superseded":
        return ("superseded", "a newer request replaced this one; use its buttons")
    if status == "cancelled" or current["run_status"] in ("cancelled", "failed", "exceeded"):
        return ("cancelled", f"the run was {current['run_status']}; nothing to decide")
    if status == "pending" and locked["deadline_fired"]:
        return ("expired", "this request's deadline has passed")
    return None


async def _permitted(conn: Conn, org_id: str, user: str, request: dict[str, Any]) -> bool:
    if user not in (request["approvers"] or []):
        return False
    row = await (
        await conn.execute(
            Q.permitted,
            {"org_id": org_id, "approver": user, "automation_id": request["automation_id"]},
        )
    ).fetchone()
    return bool(row and row["permitted"])


async def _refused(
    pool: Pool, org_id: str, approval_id: str, user: str, reason: str, via: str, worker: str
) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            Q.refused,
            {
                "org_id": org_id,
                "approval_id": approval_id,
                "decided_by": user,
                "reason": reason,
                "via": via,
                "worker": worker,
            },
        )


# -- who may decide ------------------------------------------------------------------------------


async def grant(
    pool: Pool, org_id: str, approver: str, scope: str = "*", *, actor: str | None = None
) -> dict[str, Any]:
    check_text(approver, "approver")
    check_text(scope, "scope")
    async with pool.connection() as conn, conn.transaction():
        row = await (
            await conn.execute(Q.grant, {"org_id": org_id, "approver": approver, "scope": scope})
        ).fetchone()
        assert row is not None
        await audit.record(
            conn,
            org_id,
            actor=audit.actor(actor),
            action="approver_grant",
            target=approver,
            detail={"automation_id": scope},
        )
    return dict(row)


async def revoke(
    pool: Pool, org_id: str, approver: str, scope: str = "*", *, actor: str | None = None
) -> dict[str, Any] | None:
    async with pool.connection() as conn, conn.transaction():
        row = await (
            await conn.execute(Q.revoke, {"org_id": org_id, "approver": approver, "scope": scope})
        ).fetchone()
        if row is not None:
            await audit.record(
                conn,
                org_id,
                actor=audit.actor(actor),
                action="approver_revoke",
                target=approver,
                detail={"automation_id": scope},
            )
    return dict(row) if row else None


async def list_approvers(pool: Pool, org_id: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        return list(await (await conn.execute(Q.approvers, {"org_id": org_id})).fetchall())


# -- the step kind -------------------------------------------------------------------------------


class ApprovalParams(BaseModel):
    """Ask ``approvers`` (Slack user ids) in ``channel`` through the Slack ``connection`` to
    approve ``text`` (``{input.x}`` / ``{vars.y}`` filled in) before ``deadline``; then
    ``on_deadline``: ``escalate`` to ``escalate_to`` (with a new deadline of the same length),
    ``default`` (decide ``default``), or ``stop`` (park the run for a person). After an
    escalation also expires, ``default`` applies if given, else ``stop``."""

    model_config = ConfigDict(extra="forbid")
    connection: str
    channel: str = Field(min_length=1, max_length=80)
    approvers: list[str] = Field(min_length=1)
    text: str = Field(min_length=1, max_length=MAX_CONTENT)
    deadline: str | float
    on_deadline: Literal["escalate", "default", "stop"] = "stop"
    escalate_to: list[str] | None = None
    default: Literal["approve", "reject"] | None = None

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: str | float) -> str | float:
        if parse_duration(v) <= 0:
            raise ValueError("the deadline must be positive")
        return v

    @model_validator(mode="after")
    def _policy(self) -> ApprovalParams:
        if self.on_deadline == "escalate" and not self.escalate_to:
            raise ValueError("on_deadline escalate needs escalate_to")
        if self.on_deadline == "default" and self.default is None:
            raise ValueError("on_deadline default needs default: approve or reject")
        return self


def _content(step: StepContext, params: ApprovalParams) -> str:
    return render_text(params.text, step.input, step.vars)[:MAX_CONTENT]


def content_for(definition: StepDef, run_input: Any, run_vars: Any) -> str | None:
    """The content an approval step shows for a run as it is now (None: not an approval)."""
    try:
        params = ApprovalParams.model_validate(definition.params)
    except ValueError:
        return None
    return render_text(params.text, run_input or {}, run_vars or {})[:MAX_CONTENT]


def blocks(content: str, approve: str, reject: str) -> list[dict[str, Any]]:
    """The Slack message: the content, then Approve / Reject buttons (slack_sdk's models)."""
    from slack_sdk.models.blocks import (
        ActionsBlock,
        ButtonElement,
        MarkdownTextObject,
        SectionBlock,
    )

    return [
        SectionBlock(text=MarkdownTextObject(text=content)).to_dict(),
        ActionsBlock(
            block_id="onward_approval",
            elements=[
                ButtonElement(text="Approve", action_id="approve", value=approve, style="primary"),
                ButtonElement(text="Reject", action_id="reject", value=reject, style="danger"),
            ],
        ).to_dict(),
    ]


async def _ask(
    step: StepContext,
    params: ApprovalParams,
    *,
    request: int,
    approvers: list[str],
    content: str,
) -> Wait:
    integ = _integrations(step)
    opened = await open_request(
        integ.pool,
        step,
        request=request,
        content=content,
        approvers=approvers,
        channel=params.channel,
        deadline_s=parse_duration(params.deadline),
    )
    crash_point("approval.after_request")
    secret = await token_secret(integ.pool, integ.token_secret)
    shown = {**opened, "run_id": step.run_id, "seq": step.seq}
    posted = await run_effect(
        step,
        params.connection,
        {
            "channel": params.channel,
            "text": f"Approval needed: {content[:150]}",
            "blocks": blocks(
                content,
                mint(secret, step.org_id, shown, "approved"),
                mint(secret, step.org_id, shown, "rejected"),
            ),
        },
        key=opened["approval_id"],
        harmless_repeat=True,  # a second identical message: its buttons decide once
    )
    async with integ.pool.connection() as conn:
        await conn.execute(
            Q.posted,
            {
                "org_id": step.org_id,
                "approval_id": opened["approval_id"],
                "message_ts": posted.get("ts") or posted.get("id"),
            },
        )
    return Wait(
        due_at=opened["deadline_at"],
        intent={"approval_id": opened["approval_id"], "deadline": params.deadline},
        on="approval",
    )


def _decided(row: dict[str, Any], **extra: Any) -> Advance:
    return Advance(
        output={
            "decision": row["status"],
            "approved": row["status"] == "approved",
            "decided_by": row["decided_by"],
            "via": row["decided_via"],
            "decided_at": row["decided_at"],
            "approval_id": row["approval_id"],
            "digest": row["digest"],
            **extra,
        }
    )


@step_kind("approval", lane="wait", params=ApprovalParams, reads=reads_no_outputs)
async def approval(step: StepContext) -> Any:
    """Output: ``{"decision": "approved"|"rejected", "approved": bool, "decided_by", "via",
    "approval_id", "digest", ...}``; ``via: "default"`` when the deadline's default decided."""
    params: ApprovalParams = step.params
    integ = _integrations(step)
    content = _content(step, params)
    row = await latest(integ.pool, step.org_id, step.run_id, step.seq)
    if row is None:
        return await _ask(step, params, request=1, approvers=params.approvers, content=content)
    status = row["status"]
    if status in DECISIONS.values():
        if row["digest"] == digest_of(content):
            return _decided(row)
        status = "superseded"  # decided on content that has changed since: ask again
    if status == "pending" and not row["past_deadline"]:
        # a retry of this step before it began waiting (a crash): the same request, the same
        # post (its effect is settled), the same deadline
        same = row["digest"] == digest_of(content)
        return await _ask(
            step,
            params,
            request=row["request"] if same else row["request"] + 1,
            approvers=list(row["approvers"]),
            content=content,
        )
    if status == "superseded":
        return await _ask(
            step,
            params,
            request=row["request"] + 1,
            approvers=list(row["approvers"]),
            content=content,
        )
    # the deadline passed with no decision (status pending past it, or expired)
    escalate = (
        params.on_deadline == "escalate"
        and params.escalate_to
        and list(row["approvers"]) != list(params.escalate_to)
    )
    policy = "escalate" if escalate else ("default" if params.default else "stop")
    if status == "pending" and not await expire(
        integ.pool, step.org_id, row["approval_id"], policy=policy, worker=step.worker
    ):
        # decided in the meantime: that decision stands
        fresh = await latest(integ.pool, step.org_id, step.run_id, step.seq)
        if fresh is not None and fresh["status"] in DECISIONS.values():
            return _decided(fresh)
    if escalate:
        return await _ask(
            step,
            params,
            request=row["request"] + 1,
            approvers=list(params.escalate_to or []),
            content=content,
        )
    if params.default is not None:
        return Advance(
            output={
                "decision": DECISIONS[params.default],
                "approved": params.default == "approve",
                "decided_by": None,
                "via": "default",
                "approval_id": row["approval_id"],
                "digest": row["digest"],
                "timed_out": True,
            }
        )
    raise NeedsReview(
        f"step {step.step_id}: nobody decided before the deadline "
        f"({row['deadline_at']:%Y-%m-%d %H:%M} UTC); decide what happens to this run",
        detail={"approval_id": row["approval_id"], "approvers": list(row["approvers"])},
    )
