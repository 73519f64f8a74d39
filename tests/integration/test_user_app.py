"""``onward --app MODULE[:ATTR]``: the user's module is imported first by every command; its
kinds and automations serve ``publish`` (a file, a folder in one transaction, or the app's
own), ``api``, ``demo`` and ``up``; a module that cannot be imported is one line and exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from onward.testing import Processes, auth, run_onward, steps
from tests.integration.test_cli import api_url, cli_key, deliver_and_complete, ok, serve

TAG_APP = """\
import onward

@onward.step_kind("crm.tag", lane="io")
async def tag(step: onward.StepContext) -> dict:
    return {"tagged": step.input.get("email", "nobody")}

flow = (
    onward.Automation("tagged", max_steps=20)
    .step("greet", "set", values={"greeting": "'hi ' + input.name"})
    .step("tag", "crm.tag")
)
plain = {"id": "plain", "steps": [{"id": "only", "kind": "set", "with": {"values": {"x": "1"}}}]}
flows = [flow, plain]
one_doc = onward.AutomationDoc.model_validate(flow.build())
not_flows = 42
empty = []
"""
TAG_YAML = """\
id: welcome
steps:
  - {id: tag, kind: crm.tag}
"""
GOOD_YAML = """\
id: good
steps:
  - {id: only, kind: set, with: {values: {x: "1"}}}
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "tag_app.py").write_text(TAG_APP)
    return tmp_path


def folder(path: Path, files: dict[str, str | bytes]) -> Path:
    path.mkdir()
    for name, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        (path / name).write_bytes(data)
    return path


def versions(sql: psycopg.Connection[dict[str, Any]]) -> list[tuple[str, int]]:
    rows = sql.execute(
        "SELECT automation_id, version FROM automation_versions ORDER BY automation_id, version"
    ).fetchall()
    return [(r["automation_id"], r["version"]) for r in rows]


def one_line(result: Any) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("onward: ") and result.stderr.count("\n") == 1, result.stderr
    return str(result.stderr.strip())


@pytest.mark.parametrize(
    ("files", "spec", "message"),
    [
        (
            {},
            "no_such_app",
            "cannot import app 'no_such_app': ModuleNotFoundError: No module named 'no_such_app'",
        ),
        (
            {"bad_dep.py": "import x\n"},
            "bad_dep",
            "cannot import app 'bad_dep': ModuleNotFoundError: No module named 'x'",
        ),
        (
            {"bad_syntax.py": "def (:\n"},
            "bad_syntax",
            "cannot import app 'bad_syntax': SyntaxError: invalid syntax (bad_syntax.py, line 1)",
        ),
        (
            {"boom.py": "raise RuntimeError('no config\\nsecond line')\n"},
            "boom",
            "cannot import app 'boom': RuntimeError: no config",
        ),
        (
            {"quits.py": "import sys\nsys.exit(3)\n"},
            "quits",
            "cannot import app 'quits': SystemExit: 3",
        ),
        (
            {"tag_app.py": TAG_APP},
            "tag_app:nope",
            "cannot import app 'tag_app:nope': AttributeError: module 'tag_app' has no attribute "
            "'nope'",
        ),
        (
            {"tag_app.py": TAG_APP},
            "tag_app:not_flows",
            "cannot import app 'tag_app:not_flows': tag_app:not_flows is a int; expected an "
            "onward.Automation",
        ),
        (
            {"tag_app.py": TAG_APP},
            "tag_app:empty",
            "cannot import app 'tag_app:empty': tag_app:empty holds no automation",
        ),
        (
            {"tag_app.py": TAG_APP},
            "tag_app.py",
            "cannot import app 'tag_app.py': give a module's name, not a file: --app tag_app",
        ),
    ],
)
def test_an_app_that_cannot_be_imported_is_one_line_and_exit_2(
    db_url: str, tmp_path: Path, files: dict[str, str], spec: str, message: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert message in one_line(run_onward(db_url, "--app", spec, "runs", cwd=tmp_path))


def test_onward_app_in_the_environment_is_imported_too(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text("raise ValueError('from the env')\n")
    result = run_onward(db_url, "runs", cwd=tmp_path, env={"ONWARD_APP": "boom"})
    assert "cannot import app 'boom': ValueError: from the env" in one_line(result)


def test_publish_a_file_needs_the_apps_kind(
    db_url: str, app_dir: Path, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    (app_dir / "welcome.yaml").write_text(TAG_YAML)
    refused = run_onward(db_url, "publish", "welcome.yaml", cwd=app_dir)
    assert "welcome.yaml: step tag: unknown step kind 'crm.tag'" in one_line(refused)
    assert versions(sql) == []
    out = ok(run_onward(db_url, "--app", "tag_app", "publish", "welcome.yaml", cwd=app_dir))
    assert out.strip() == "published welcome version 1"
    assert versions(sql) == [("welcome", 1)]


def test_publish_a_folder_is_all_or_none_with_each_problem_named(
    db_url: str, app_dir: Path, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    also = {"id": "also", "steps": [{"id": "a", "kind": "set", "with": {"values": {"x": "1"}}}]}
    folder(
        app_dir / "flows",
        {
            "good.yaml": GOOD_YAML,
            "welcome.yml": TAG_YAML,
            "also.json": json.dumps(also),
            "notes.txt": "not a document",
        },
    )

    refused = run_onward(db_url, "publish", "flows", cwd=app_dir)
    assert "invalid automation: flows/welcome.yml: step tag: unknown step kind 'crm.tag'" in (
        one_line(refused)
    )
    assert versions(sql) == []  # good.yaml and also.json were not stored either

    out = ok(run_onward(db_url, "--app", "tag_app", "publish", "flows", cwd=app_dir))
    assert out.splitlines() == [
        "published also version 1  (flows/also.json)",
        "published good version 1  (flows/good.yaml)",
        "published welcome version 1  (flows/welcome.yml)",
    ]
    assert versions(sql) == [("also", 1), ("good", 1), ("welcome", 1)]
    again = json.loads(
        ok(run_onward(db_url, "--app", "tag_app", "publish", "flows", "--json", cwd=app_dir))
    )
    assert [(a["automation_id"], a["created"], a["source"]) for a in again] == [
        ("also", False, "flows/also.json"),
        ("good", False, "flows/good.yaml"),
        ("welcome", False, "flows/welcome.yml"),
    ]


def test_publish_a_folder_names_every_broken_file(
    db_url: str, tmp_path: Path, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    folder(
        tmp_path / "flows",
        {
            "good.yaml": GOOD_YAML,
            "latin1.yaml": "id: caf\xe9\nsteps: []\n".encode("latin-1"),
            "list.yaml": "- just\n- a list\n",
        },
    )
    result = run_onward(db_url, "publish", "flows", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("onward: invalid automation: flows/latin1.yaml: "), lines
    assert lines[1].startswith("onward: invalid automation: flows/list.yaml: "), lines
    assert versions(sql) == []


def test_publish_an_empty_folder_or_nothing_is_a_usage_problem(
    db_url: str, tmp_path: Path, app_dir: Path
) -> None:
    (tmp_path / "empty").mkdir()
    assert "empty: no *.yaml, *.yml, *.json files" in one_line(
        run_onward(db_url, "publish", "empty", cwd=tmp_path)
    )
    message = "publish: give a FILE or DIR, or --app MODULE:ATTR naming your automations"
    assert message in one_line(run_onward(db_url, "publish", cwd=tmp_path))
    assert message in one_line(run_onward(db_url, "--app", "tag_app", "publish", cwd=app_dir))


def test_publish_the_apps_automations(
    db_url: str, app_dir: Path, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    out = ok(run_onward(db_url, "--app", "tag_app:flows", "publish", cwd=app_dir))
    assert out.splitlines() == [
        "published tagged version 1  (tag_app:flows[0])",
        "published plain version 1  (tag_app:flows[1])",
    ]
    single = json.loads(
        ok(run_onward(db_url, "--app", "tag_app:one_doc", "publish", "--json", cwd=app_dir))
    )
    assert [(a["automation_id"], a["version"], a["created"], a["source"]) for a in single] == [
        ("tagged", 1, False, "tag_app:one_doc")
    ]
    assert versions(sql) == [("plain", 1), ("tagged", 1)]


def test_the_api_knows_the_apps_kinds(db_url: str, app_dir: Path, processes: Processes) -> None:
    api = serve(processes, db_url, "api", "--port", "0", app="tag_app", cwd=app_dir)
    url = api_url(api)
    with httpx.Client(base_url=url, timeout=10, headers=auth(cli_key(db_url))) as client:
        reply = client.post(
            "/v1/automations", content=TAG_YAML, headers={"content-type": "application/yaml"}
        )
        assert reply.status_code == 201, reply.text
    assert api.stop() == 0, api.log_text()


def test_demo_runs_the_apps_first_automation(db_url: str, app_dir: Path) -> None:
    payload = json.dumps({"name": "Ada", "email": "ada@example.test"})
    out = ok(
        run_onward(
            db_url, "--app", "tag_app:flows", "demo", "--payload", payload, cwd=app_dir, timeout=90
        )
    )
    assert "published tagged version 1 (new)" in out and "published plain version 1 (new)" in out
    assert re.search(r"delivery 1: POST /v1/hooks/tagged .* -> 202 created", out), out
    assert re.search(r"delivery 2: POST /v1/hooks/tagged .* -> 200 duplicate", out), out
    assert re.search(r"run \w+  tagged v1  status=completed", out), out


def test_up_publishes_the_apps_automations_and_runs_its_kinds(
    db_url: str, app_dir: Path, processes: Processes, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    up = serve(processes, db_url, "up", "--port", "0", app="tag_app:flow", cwd=app_dir)
    url = api_url(up)
    assert up.find(r"published tagged version 1  \(tag_app:flow\)")
    key = cli_key(db_url)
    run_id = deliver_and_complete(url, key, "tagged", {"name": "Bo", "email": "bo@example.test"})
    assert up.stop() == 0, up.log_text()
    (tag,) = steps(sql, run_id, "tag")
    assert tag["output"] == {"tagged": "bo@example.test"}
