"""The ledger: an append-only record of every piece of real work the sandbox providers did.

Tests and the chaos runner read it to count effects: a message sent twice shows up as two
entries, while an idempotent replay (same key, same account) appends nothing. That makes
"exactly one email reached Maya" a checkable fact rather than a hope.

Every entry carries when the work was done twice over: ``at`` (ISO 8601, milliseconds, for
people) and ``ts`` (seconds since the epoch as a float, microseconds, for arithmetic: a test
checking a provider-side rate slides a window over ``ts``).
"""

from __future__ import annotations

import copy
import itertools
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import Request


def iso_of(ts: float) -> str:
    """``ts`` (epoch seconds) in ISO 8601 UTC with milliseconds and a ``Z``, like ``now_iso``."""
    at = datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
    return at.replace("+00:00", "Z")


@dataclass(frozen=True)
class LedgerEntry:
    """One piece of work a provider really did."""

    seq: int
    provider: str
    account: str
    op: str
    idempotency_key: str | None
    metadata: dict[str, Any]
    request: dict[str, Any]
    response_id: str | None
    at: str
    ts: float  # time.time() when the work was recorded

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Ledger:
    """In-memory, process-wide ledger. Only touched from the event loop, so no locking."""

    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []
        self._seq = itertools.count(1)

    def append(
        self,
        *,
        provider: str,
        account: str,
        op: str,
        idempotency_key: str | None,
        request: dict[str, Any],
        response_id: str | None,
        metadata: dict[str, Any] | None = None,
    ) -> LedgerEntry:
        now = time.time()
        entry = LedgerEntry(
            seq=next(self._seq),
            provider=provider,
            account=account,
            op=op,
            idempotency_key=idempotency_key,
            # Copies, so later changes to provider state can't rewrite history.
            metadata=copy.deepcopy(metadata or {}),
            request=copy.deepcopy(request),
            response_id=response_id,
            at=iso_of(now),
            ts=now,
        )
        self._entries.append(entry)
        return entry

    def entries(
        self,
        *,
        provider: str | None = None,
        account: str | None = None,
        idempotency_key: str | None = None,
    ) -> list[LedgerEntry]:
        return [
            e
            for e in self._entries
            if (provider is None or e.provider == provider)
            and (account is None or e.account == account)
            and (idempotency_key is None or e.idempotency_key == idempotency_key)
        ]

    def clear(self) -> None:
        self._entries.clear()
        self._seq = itertools.count(1)


def get_ledger(request: Request) -> Ledger:
    """FastAPI dependency: the ledger of the world this app serves."""
    ledger: Ledger = request.app.state.world.ledger
    return ledger
