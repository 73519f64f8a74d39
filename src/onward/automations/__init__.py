"""Automations: documents, validation, CEL, the Python builder, and published versions."""

from onward.automations.builder import Automation
from onward.automations.document import AutomationDoc, load_file, parse_text
from onward.automations.validate import validate

__all__ = ["Automation", "AutomationDoc", "load_file", "parse_text", "validate"]
