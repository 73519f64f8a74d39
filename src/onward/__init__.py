"""onward: a durable workflow engine. PostgreSQL stores what has happened and what must happen
next; a queue only wakes workers.

The public API is what this module exports; everything else is internal and may change.
"""

from onward.automations.builder import Automation
from onward.automations.document import AutomationDoc
from onward.config import Settings
from onward.connectors import Connection, Connector, classify, register_connector
from onward.effect_kinds import run_effect
from onward.engine import Engine
from onward.errors import (
    ActionRefused,
    AuthorizationError,
    BudgetExhausted,
    CircuitOpen,
    ConfigError,
    ContactErased,
    DecisionRefused,
    Deferred,
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
    SignalRefused,
    StepError,
    Unavailable,
    UnknownApproval,
    UnknownAutomation,
    UnknownConnection,
    UnknownOperation,
    UnknownRun,
    UnknownSchedule,
)
from onward.kinds import Advance, StepContext, Wait, registry, step_kind
from onward.start import Started

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
    "Settings",
    "SignalRefused",
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
    "register_connector",
    "registry",
    "run_effect",
    "step_kind",
]
