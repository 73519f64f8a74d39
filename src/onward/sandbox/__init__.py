"""A sandbox of fake-but-real HTTP providers (email, CRM, model, payment, Slack) with faults.

The engine is tested end to end over real HTTP against it: every provider requires a bearer
token (the token names the account), records real work in a ledger, and can be told to be slow,
to fail, to rate-limit, to refuse a revoked account, or to do the work and then drop the
connection. See :mod:`onward.sandbox.faults` for the knobs and :class:`SandboxServer` to run it.
"""

from onward.sandbox.admin import SandboxAdmin, SandboxAdminError
from onward.sandbox.app import SandboxApp, World, create_app
from onward.sandbox.common import PROVIDERS
from onward.sandbox.faults import FaultKnobs
from onward.sandbox.server import SandboxServer, serve

__all__ = [
    "PROVIDERS",
    "FaultKnobs",
    "SandboxAdmin",
    "SandboxAdminError",
    "SandboxApp",
    "SandboxServer",
    "World",
    "create_app",
    "serve",
]
