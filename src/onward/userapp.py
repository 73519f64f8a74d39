"""Loading the user's code: ``onward --app MODULE[:ATTR]`` (or ``ONWARD_APP``).

The way ``uvicorn app:app`` and ``celery -A`` do it: the current directory goes first on
``sys.path``, then ``MODULE`` is imported. Importing it is what registers its step kinds
(``@onward.step_kind``) and connectors (``onward.connectors.register_connector``), so every
command of that process (``up``, ``worker``, ``api``, ``publish``, ``start``, ``demo``, ...)
knows them.

``ATTR``, when given, names the module's automations: an ``onward.Automation`` (the builder), an
``AutomationDoc``, a document as a dict, or a list or tuple of those. ``onward publish`` with no
file publishes them; ``up`` and ``demo`` publish them when they start. Without ``ATTR`` the
module only registers what it registers.

Anything that goes wrong (the module or one it imports is missing, a syntax error, an exception
raised while importing, a missing or unusable ``ATTR``) is one ``ConfigError`` naming the app
and the exception: ``cannot import app 'welcome_app': ModuleNotFoundError: No module named
'x'``.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from onward.automations.builder import Automation
from onward.automations.document import AutomationDoc
from onward.errors import ConfigError

Document = dict[str, Any] | AutomationDoc


@dataclass(frozen=True)
class UserApp:
    """An imported app: its module and, when ``ATTR`` was given, its automations as
    ``(source, document)`` pairs (the source names each one in error messages)."""

    spec: str
    module: ModuleType
    automations: list[tuple[str, Document]] = field(default_factory=list)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def load_app(spec: str) -> UserApp:
    """Import ``MODULE[:ATTR]`` with the current directory importable; see the module doc."""
    module_name, _, attr = spec.strip().partition(":")

    def fail(why: str) -> ConfigError:
        return ConfigError(f"cannot import app {spec!r}: {why}")

    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        hint = module_name.removesuffix(".py").replace("/", ".").replace(os.sep, ".")
        raise fail(f"give a module's name, not a file: --app {hint}")
    if not module_name or (":" in spec and not attr):
        raise fail("expected MODULE or MODULE:ATTR")
    cwd = os.getcwd()
    if not sys.path or sys.path[0] != cwd:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:
        raise fail(_first_line(exc)) from None
    if not attr:
        return UserApp(spec, module)
    try:
        value = getattr(module, attr)
    except AttributeError as exc:
        raise fail(_first_line(exc)) from None
    try:
        documents = automations_of(value, spec)
    except TypeError as exc:
        raise fail(str(exc)) from None
    return UserApp(spec, module, documents)


def automations_of(value: Any, source: str) -> list[tuple[str, Document]]:
    """``value`` as ``(source, document)`` pairs; TypeError if it holds anything else."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    out: list[tuple[str, Document]] = []
    for i, item in enumerate(items):
        where = f"{source}[{i}]" if isinstance(value, list | tuple) else source
        if isinstance(item, Automation):
            out.append((where, item.build()))
        elif isinstance(item, AutomationDoc | dict):
            out.append((where, item))
        else:
            raise TypeError(
                f"{where} is a {type(item).__name__}; expected an onward.Automation, an "
                "AutomationDoc, a dict, or a list of them"
            )
    if not out:
        raise TypeError(f"{source} holds no automation")
    return out
