"""Which API key scope each route needs (issue 14, Build 1): the whole access policy of the
HTTP API in one table, read by the API's one organisation dependency (``app.get_org``).

* a scope (``runs:read``, ``runs:write``, ``automations:write``, ``admin``): the request needs
  a live key of some organisation holding that scope (``admin`` holds all); the request then
  acts for that key's organisation and no other;
* :data:`PUBLIC`: no key -- the health probe and the API's own documentation, which name no
  organisation's data;
* :data:`SIGNED`: no key -- a provider's callback, which proves itself by its own signature
  (Standard Webhooks for a webhook endpoint given secrets, Slack's for interactivity) and acts
  for the organisation its path names (``/v1/orgs/{org_id}/...``; the un-prefixed Slack path
  is the engine's own organisation, ``ONWARD_ORG``).

A route missing from the table is refused outright (``needed`` raises ``KeyError``;
tests/integration/test_api_keys.py checks that every route of the app is here).
"""

from __future__ import annotations

from fastapi import Request

PUBLIC = "public"
SIGNED = "signed"
READ, WRITE, AUTOMATIONS, ADMIN = "runs:read", "runs:write", "automations:write", "admin"

ROUTES: dict[tuple[str, str], str] = {
    # the probe and the documentation
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/redoc"): PUBLIC,
    # provider callbacks, each verified by its own signature
    ("POST", "/v1/orgs/{org_id}/hooks/{automation_id}"): SIGNED,
    ("POST", "/v1/orgs/{org_id}/slack/{connection_id}/interactivity"): SIGNED,
    ("POST", "/v1/slack/{connection_id}/interactivity"): SIGNED,
    # runs: reading
    ("GET", "/v1/runs"): READ,
    ("GET", "/v1/runs/{run_id}"): READ,
    ("GET", "/v1/automations"): READ,
    ("GET", "/v1/schedules"): READ,
    ("GET", "/v1/signals"): READ,
    ("GET", "/v1/approvals"): READ,
    ("GET", "/v1/approvers"): READ,
    ("GET", "/v1/limits"): READ,
    ("GET", "/v1/circuits"): READ,
    ("GET", "/v1/budgets"): READ,
    ("GET", "/v1/lanes"): READ,
    ("GET", "/v1/notifications"): READ,
    ("GET", "/v1/operations"): READ,
    ("GET", "/v1/operations/{operation_id}"): READ,
    ("GET", "/v1/timers/preview"): READ,
    ("GET", "/v1/retention"): READ,
    # runs: changing them
    ("POST", "/v1/hooks/{automation_id}"): WRITE,
    ("POST", "/v1/runs"): WRITE,
    ("POST", "/v1/runs:batch"): WRITE,
    ("POST", "/v1/runs/cancel"): WRITE,
    ("POST", "/v1/runs/{run_id}/cancel"): WRITE,
    ("POST", "/v1/runs/{run_id}/review"): WRITE,
    ("POST", "/v1/runs/{run_id}/resume"): WRITE,
    ("POST", "/v1/runs/{run_id}/fork"): WRITE,
    ("POST", "/v1/signals"): WRITE,
    ("POST", "/v1/inbound/email"): WRITE,
    ("POST", "/v1/approvals/decide"): WRITE,
    ("POST", "/v1/timers/recompute"): WRITE,
    ("POST", "/v1/timers/skip"): WRITE,
    ("POST", "/v1/notifications/retry"): WRITE,
    ("POST", "/v1/notifications/{notification_id}/retry"): WRITE,
    # automations
    ("POST", "/v1/automations"): AUTOMATIONS,
    ("POST", "/v1/automations/{automation_id}/migrations"): AUTOMATIONS,
    ("POST", "/v1/schedules/{automation_id}/{schedule_id}/pause"): AUTOMATIONS,
    ("POST", "/v1/schedules/{automation_id}/{schedule_id}/resume"): AUTOMATIONS,
    ("POST", "/v1/schedules/{automation_id}/{schedule_id}/trigger"): AUTOMATIONS,
    ("GET", "/v1/automations/{automation_id}/hook-secrets"): AUTOMATIONS,
    ("POST", "/v1/automations/{automation_id}/hook-secrets"): AUTOMATIONS,
    ("DELETE", "/v1/automations/{automation_id}/hook-secrets/{secret_id}"): AUTOMATIONS,
    # the organisation: keys, people, connections, limits, data
    ("GET", "/v1/keys"): ADMIN,
    ("POST", "/v1/keys"): ADMIN,
    ("DELETE", "/v1/keys/{key_id}"): ADMIN,
    ("POST", "/v1/approvers"): ADMIN,
    ("DELETE", "/v1/approvers/{approver}"): ADMIN,
    ("POST", "/v1/connections"): ADMIN,
    ("POST", "/v1/connections/{connection_id}/restore"): ADMIN,
    ("POST", "/v1/connections/{connection_id}/probe"): ADMIN,
    ("POST", "/v1/suppressions"): ADMIN,
    ("PUT", "/v1/limits/{key}"): ADMIN,
    ("DELETE", "/v1/limits/{key}"): ADMIN,
    ("PUT", "/v1/circuits/{key}"): ADMIN,
    ("PUT", "/v1/budgets/{scope}/{unit}"): ADMIN,
    ("PUT", "/v1/retention"): ADMIN,
    ("POST", "/v1/retention/prune"): ADMIN,
    ("POST", "/v1/contacts/{contact_id}/erase"): ADMIN,
    ("GET", "/v1/audit"): ADMIN,
    ("GET", "/v1/outbound/allow"): ADMIN,
    ("POST", "/v1/outbound/allow"): ADMIN,
    ("POST", "/v1/outbound/disallow"): ADMIN,
    ("GET", "/v1/notification-destinations"): ADMIN,
    ("PUT", "/v1/notification-destinations/{destination_id}"): ADMIN,
    ("DELETE", "/v1/notification-destinations/{destination_id}"): ADMIN,
}


def needed(request: Request) -> str:
    """What the matched route of ``request`` needs: a scope, :data:`PUBLIC` or :data:`SIGNED`."""
    route = request.scope.get("route")
    path = getattr(route, "path", None)
    method = "GET" if request.method == "HEAD" else request.method
    return ROUTES[(method, str(path))]
