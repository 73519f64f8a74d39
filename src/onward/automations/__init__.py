"""Automations: documents, validation, CEL, the Python builder, and published versions.


Its names are imported when first used (PEP 562): ``onward.kinds`` imports
``onward.automations.document`` and ``onward.automations.validate`` imports ``onward.kinds``, so
a package that imported them all here would make the order of a process's first imports
matter."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onward.automations.builder import Automation
    from onward.automations.document import AutomationDoc, load_file, parse_text

_LAZY = {
    "Automation": "onward.automations.builder",
    "AutomationDoc": "onward.automations.document",
    "load_file": "onward.automations.document",
    "parse_text": "onward.automations.document",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'onward.automations' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


# (validation: onward.automations.validate.validate -- a package attribute of that name would
# be the submodule once it is imported)
__all__ = ["Automation", "AutomationDoc", "load_file", "parse_text"]
