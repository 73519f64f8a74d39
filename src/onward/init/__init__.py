"""``onward init [DIR] [--template follow-up|webhook|schedule]``: a small working project.

Five files, from the templates in ``templates/`` (``$name``-style placeholders,
:class:`string.Template`), named after the folder (``hello`` -> automation ``hello``, module
``hello_app``, step kind ``hello.note``):

* ``<slug>.yaml`` -- the automation document (the template's own: a webhook-started follow-up
  with a durable wait, a webhook that branches on the event, or a daily schedule);
* ``<module>.py`` -- one step kind (``<ident>.note``) and one connector (``notebook``, a
  provider of the project's own that writes each note once per idempotency key), and ``app``,
  the automations ``--app <module>:app`` publishes;
* ``onward.toml`` -- the settings every ``onward`` command reads in that folder (the app, and
  the ``notebook`` connection; see :mod:`onward.init.project`);
* ``README.md`` -- five lines: what is where, run, watch, test, stop;
* ``test_<ident>.py`` -- the automation end to end on a real PostgreSQL with ``pytest``.

A folder that is not empty is refused (:class:`NotEmpty`) unless ``force``, which overwrites
only the five files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template


@dataclass(frozen=True)
class Kind:
    """What a template starts its run with, and the note its test expects."""

    payload: dict[str, object]
    expected: str
    start: str  # the README's way to start a run ($slug filled in)


TEMPLATES = {
    "follow-up": Kind(
        {"name": "Maya"},
        "Hello Maya, welcome aboard!",
        """onward start $slug --payload '{"name": "Maya"}'""",
    ),
    "webhook": Kind(
        {"type": "invoice.paid", "amount": 4200},
        "invoice paid: 4200",
        """onward start $slug --payload '{"type": "invoice.paid", "amount": 4200}'""",
    ),
    "schedule": Kind(
        {"team": "everyone"},
        "digest for everyone",
        "onward schedules trigger $slug daily",
    ),
}
DEFAULT = "follow-up"


class NotEmpty(Exception):
    """The target folder holds files already (``--force`` writes anyway)."""


@dataclass(frozen=True)
class Names:
    name: str  # the folder's name, as given
    slug: str  # the automation id: hello-world
    ident: str  # a Python identifier: hello_world (the step kind's prefix)
    module: str  # hello_world_app

    @classmethod
    def of(cls, folder: Path) -> Names:
        name = folder.resolve().name
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        if not slug or not slug[0].isalpha():
            slug = f"app-{slug}".rstrip("-")
        ident = slug.replace("-", "_")
        return cls(name, slug, ident, f"{ident}_app")


def _template(name: str) -> str:
    return resources.files(__package__).joinpath("templates", name).read_text(encoding="utf-8")


def files_for(names: Names, template: str) -> dict[str, str]:
    """{file name: text} of the project ``template`` for ``names``."""
    kind = TEMPLATES[template]
    values = {
        "name": names.name,
        "slug": names.slug,
        "ident": names.ident,
        "module": names.module,
        "template": template,
        "payload": repr(kind.payload),
        "expected": json.dumps(kind.expected),
        "start": Template(kind.start).substitute(slug=names.slug),
    }

    def fill(source: str) -> str:
        return Template(_template(source)).substitute(values)

    return {
        f"{names.slug}.yaml": fill(f"{template}/automation.yaml.tmpl"),
        f"{names.module}.py": fill("app.py.tmpl"),
        "onward.toml": fill("onward.toml.tmpl"),
        "README.md": fill("README.md.tmpl"),
        f"test_{names.ident}.py": fill("test_app.py.tmpl"),
    }


def scaffold(folder: Path, template: str = DEFAULT, *, force: bool = False) -> list[Path]:
    """Write the project into ``folder`` (created if missing); returns the files written."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)}")
    if folder.exists() and not folder.is_dir():
        raise NotEmpty(f"{folder} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise NotEmpty(f"{folder} is not empty (--force writes the project's files anyway)")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files_for(Names.of(folder), template).items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
