"""onward: a durable workflow engine. PostgreSQL stores what has happened and what must happen
next; a queue only wakes workers.

The public API is what this module exports; everything else is internal and may change.
"""

from typing import TYPE_CHECKING, Any

from onward.errors import (
    ActionRefused,
    AuthorizationError,
    BudgetExhausted,
    CircuitOpen,
    ConfigError,
    ContactErased,
    DecisionRefused,
    Deferred,
    IntakeLimited,
    InvalidAutomation,
    InvalidInput,
    LeaseLost,
    MigrationRefused,
    NeedsReview,
    OnwardError,
    OutboundRefused,
    OutcomeUnknown,
    PayloadTooLarge,
    PermanentError,
    QueueMisconfigured,
    RateLimited,
    RetryableError,
    RunCancelled,
    SecretUnreadable,
    SignalRefused,
    SignatureRefused,
    StepError,
    Unavailable,
    UnknownApproval,
    UnknownAutomation,
    UnknownConnection,
    UnknownOperation,
    UnknownRun,
    UnknownSchedule,
)

if TYPE_CHECKING:
    from onward.automations.builder import Automation
    from onward.automations.document import AutomationDoc
    from onward.config import Settings
    from onward.connectors import Connection, Connector, classify, register_connector
    from onward.effect_kinds import run_effect
    from onward.engine import Engine
    from onward.kinds import Advance, StepContext, Wait, reads_no_outputs, registry, step_kind
    from onward.start import Start, Started

# The rest of the public API is imported when first named (PEP 562), so `import onward` -- a
# CLI's start, a process that only reads its settings -- does not load the engine, pydantic,
# FastAPI's models, prometheus-client and structlog. Naming any of it loads all of it, in the
# order the modules' imports resolve, so the built-in kinds are always registered.
_LAZY = {
    "Automation": "onward.automations.builder",
    "AutomationDoc": "onward.automations.document",
    "Settings": "onward.config",
    "Connection": "onward.connectors",
    "Connector": "onward.connectors",
    "classify": "onward.connectors",
    "register_connector": "onward.connectors",
    "run_effect": "onward.effect_kinds",
    "Engine": "onward.engine",
    "Advance": "onward.kinds",
    "StepContext": "onward.kinds",
    "Wait": "onward.kinds",
    "reads_no_outputs": "onward.kinds",
    "registry": "onward.kinds",
    "step_kind": "onward.kinds",
    "Start": "onward.start",
    "Started": "onward.start",
}


_ORDER = tuple(dict.fromkeys(_LAZY.values()))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'onward' has no attribute {name!r}")
    import importlib

    for first in _ORDER:  # in the order their imports resolve (and the built-ins register)
        importlib.import_module(first)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ActionRefused",
    "Advance",
    "AuthorizationError",
    "Automation",
    "AutomationDoc",
    "BudgetExhausted",
    "CircuitOpen",
    "ConfigError",
    "Connection",
    "Connector",
    "ContactErased",
    "DecisionRefused",
    "Deferred",
    "Engine",
    "IntakeLimited",
    "InvalidAutomation",
    "InvalidInput",
    "LeaseLost",
    "MigrationRefused",
    "NeedsReview",
    "OnwardError",
    "OutboundRefused",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PermanentError",
    "QueueMisconfigured",
    "RateLimited",
    "RetryableError",
    "RunCancelled",
    "SecretUnreadable",
    "Settings",
    "SignalRefused",
    "SignatureRefused",
    "Start",
    "Started",
    "StepContext",
    "StepError",
    "Unavailable",
    "UnknownApproval",
    "UnknownAutomation",
    "UnknownConnection",
    "UnknownOperation",
    "UnknownRun",
    "UnknownSchedule",
    "Wait",
    "classify",
    "reads_no_outputs",
    "register_connector",
    "registry",
    "run_effect",
    "step_kind",
]
