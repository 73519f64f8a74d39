"""``onward.toml``: the settings file of a project, read from the current folder by every
``onward`` command (the file ``onward init`` writes).

::

    [onward]
    app = "hello_app:app"          # --app / ONWARD_APP
    # database_url = "postgresql://..."   # unset: the embedded PostgreSQL
    # data_dir, queue, org, redis_url     # as --data-dir, --queue, --org, --redis-url

    [connections.notebook]         # connected when the app's automations are published
    provider = "notebook"
    base_url = "notebook.jsonl"
    account = "hello"
    secret = "not-a-secret"

A command-line flag or an ``ONWARD_*`` variable wins over the file; the file wins over the
defaults. The connections are added (or their credentials replaced) by ``onward publish``
without a file, ``onward up`` and ``onward demo`` -- the commands that publish the app's
automations -- so a run finds its connection. Anything the file holds that onward does not
know is one line and exit 2, never ignored.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onward.errors import ConfigError

FILE = "onward.toml"
#: [onward] keys and the global option each stands for
SETTINGS = {
    "app": "--app",
    "database_url": "--database-url",
    "data_dir": "--data-dir",
    "queue": "--queue",
    "org": "--org",
    "redis_url": "--redis-url",
}
CONNECTION_KEYS = {"provider", "base_url", "account", "secret"}


@dataclass(frozen=True)
class Connection:
    connection_id: str
    provider: str
    base_url: str
    account: str
    secret: str


@dataclass(frozen=True)
class Project:
    path: Path | None = None
    settings: dict[str, str] = field(default_factory=dict)
    connections: list[Connection] = field(default_factory=list)


def read_project(folder: Path | None = None) -> Project:
    """The ``onward.toml`` of ``folder`` (default: the current folder); an empty Project when
    there is none. ``ConfigError`` names the file and what is wrong with it."""
    path = (folder or Path.cwd()) / FILE
    if not path.is_file():
        return Project()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    unknown = sorted(set(data) - {"onward", "connections"})
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(unknown)}; expected [onward]")
    return Project(path, _settings(path, data.get("onward", {})), _connections(path, data))


def _settings(path: Path, table: Any) -> dict[str, str]:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [onward] must be a table")
    unknown = sorted(set(table) - set(SETTINGS))
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {', '.join(unknown)} in [onward]; "
            f"known: {', '.join(SETTINGS)}"
        )
    for key, value in table.items():
        if not isinstance(value, str):
            raise ConfigError(f"{path}: [onward] {key} must be a string")
    return dict(table)


def _connections(path: Path, data: dict[str, Any]) -> list[Connection]:
    tables = data.get("connections", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{path}: [connections.NAME] tables expected")
    out = []
    for cid, table in tables.items():
        where = f"{path}: [connections.{cid}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table")
        unknown = sorted(set(table) - CONNECTION_KEYS)
        missing = sorted({"provider", "base_url"} - set(table))
        if unknown or missing:
            raise ConfigError(
                f"{where}: "
                + "; ".join(
                    [f"unknown key(s) {', '.join(unknown)}"] * bool(unknown)
                    + [f"missing {', '.join(missing)}"] * bool(missing)
                )
            )
        if not all(isinstance(v, str) for v in table.values()):
            raise ConfigError(f"{where}: every value must be a string")
        out.append(
            Connection(
                cid,
                table["provider"],
                table["base_url"],
                str(table.get("account", cid)),
                str(table.get("secret", "")),
            )
        )
    return out
