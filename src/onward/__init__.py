"""onward: a durable workflow engine. PostgreSQL stores what has happened and what must happen
next; a queue only wakes workers.

The public API is what this module exports; everything else is internal and may change.
"""

from onward.automations.builder import Automation
from onward.automations.document import AutomationDoc
from onward.config import Settings
from onward.engine import Engine
from onward.errors import (
    AuthorizationError,
    ConfigError,
    InvalidAutomation,
    NeedsReview,
    OnwardError,
    OutcomeUnknown,
    PayloadTooLarge,
    PermanentError,
    QueueMisconfigured,
    RateLimited,
    RetryableError,
    StepError,
    UnknownRun,
)
from onward.kinds import Advance, StepContext, Wait, registry, step_kind
from onward.start import Started

__all__ = [
    "Advance",
    "AuthorizationError",
    "Automation",
    "AutomationDoc",
    "ConfigError",
    "Engine",
    "InvalidAutomation",
    "NeedsReview",
    "OnwardError",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PermanentError",
    "QueueMisconfigured",
    "RateLimited",
    "RetryableError",
    "Settings",
    "Started",
    "StepContext",
    "StepError",
    "UnknownRun",
    "Wait",
    "registry",
    "step_kind",
]
