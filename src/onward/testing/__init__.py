"""Test support for onward and for automations built on it, in one place: real databases, real
processes, and the readers and checks every test of a durable engine needs. Nothing here mocks
the database, the queue or a process. onward's own unit, integration, acceptance and chaos
tests use it, and so does ``onward chaos``. ``import onward`` never loads it.

Databases (:mod:`onward.testing.databases`)
    ``TemporaryDatabases(admin_url, tag=)``: a migrated template database (``prepare_template``),
    cloned per test (``create() -> url``, a file copy), so each test has its own empty onward
    schema; ``drop(url)``, ``drop_template()``. ``with_database(url, name)``,
    ``with_query(url, application_name=...)``.

Waiting (:mod:`onward.testing.waiting`)
    ``await eventually(check, timeout=, interval=, what=)`` and ``eventually_sync(...)``: poll
    until ``check()`` returns something truthy and return it; ``AssertionError`` with the last
    value at the timeout. Never a fixed sleep. ``await lock_awaited(sql, besides=pid)``: until
    a backend other than ``pid`` waits for a lock (a test that makes a real deadlock).

Processes (:mod:`onward.testing.processes`)
    ``Process``: a child writing to a log file -- ``alive()``, ``signal(sig)``, ``kill()``,
    ``terminate()``, ``tell(line)`` (stdin), ``log_text()``, ``tail()``, ``read_new()``,
    ``printed(prefix)``, ``find(pattern)`` (a regular expression, line by line),
    ``await ready()``, ``await exited()``; blocking, for synchronous tests,
    ``wait_for(pattern)``, ``wait()`` and ``stop()`` (SIGTERM, then the exit code); and
    ``close()``, which always reaps it. ``Processes(log_dir)``: the children of one test,
    closed together with their logs printed; ``start(argv, name)`` starts any command line,
    ``onward(url, *args)`` a long-running ``onward`` command (``up``, ``api``, ``worker``).
    ``process_env(crash_at=, clock_offset=)``: a child's environment with a crash point armed
    (``ONWARD_CRASH_AT``) and its clocks skewed (libfaketime). ``onward_argv(url, *args)``: the
    ``onward`` command line in this interpreter; ``run_onward(url, *args, env=, cwd=)`` runs a
    short one to completion (its ``CompletedProcess``), as a process forked from this test
    process's zygote (:mod:`onward.testing.zygote`: onward imported once; ``ONWARD_TEST_FORK=0``:
    a fresh interpreter each time). ``run_python(code, *args,
    clock_offset=)`` runs a snippet in a fresh interpreter; ``loaded_modules(*imports)`` says
    which ``onward`` modules a fresh interpreter loads for those imports. What ``/proc`` says
    (Linux; shared with ``onward bench intake``): ``free_port()``, ``child_pids(pid)``,
    ``pid_alive(pid)``, ``cpu_seconds(pids)``, ``peak_rss_mb(pids)``.

Worker processes (:mod:`onward.testing.worker`)
    ``python -m onward.testing.worker worker|starter``: a real onward process (worker, relay,
    optionally the elected sweeper; or the chaos scenario's starter). ``spawn_worker(settings,
    name, log_dir=, crash_at=, clock_offset=, sweeper=, relay=, worker=, twice=, lanes=,
    kinds=, leader_ttl=, app_prefix=, standby=)`` starts one; ``Processes.worker(...)`` does so
    inside a test's group. It prints ``ready <name> crash_at=<armed>``, ``stopping on
    SIGTERM``, ``stats {...}`` and ``stopped``.

API keys (:mod:`onward.testing.keys`)
    ``await api_key(engine, *scopes)``: a new key of the engine's organisation (default
    ``admin``); ``auth(key)``: the headers that present it (``Authorization: Bearer``), e.g.
    ``httpx.AsyncClient(..., headers=auth(key))``. A provider given only a URL gets the key as
    Basic user info: ``onward.api_keys.with_key(url, key)``.

Step kinds for tests (:mod:`onward.testing.kinds`)
    ``test.sleep`` (``SLEEP_KIND``): sleeps, answers the attempt, the worker and its clock.

Rows (:mod:`onward.testing.rows`)
    Readers: ``history(conn, run_id, *events, seq=)``, ``attempts(conn, run_id, seq=)`` (every
    claim: ended ones from history, running ones from the step row), ``step_row(conn, run_id,
    seq)`` (with
    ``lapsed``), ``steps(conn, run_id, step_id=None)``, ``run_row(conn, run_id)``,
    ``effect_row(conn, key)``, ``run_effects(conn, run_id)``. Checks:
    ``double_transitions(conn, org=)`` -> ``{check: count}`` of everything applied twice (a
    claim, done, wait or timer firing twice for one attempt, a step done twice, a timer fired
    twice, a run completed twice, a step settled by a stale attempt, two step rows at one
    position); ``assert_nothing_applied_twice(conn)``; ``unfinished_runs(conn)``,
    ``runs_without_way_forward(conn)`` (the doctor's check) and ``lost_runs(conn)``.
"""

from onward.testing.databases import TemporaryDatabases, with_database, with_query
from onward.testing.keys import api_key, auth
from onward.testing.processes import (
    Process,
    Processes,
    child_pids,
    cpu_seconds,
    free_port,
    libfaketime,
    loaded_modules,
    onward_argv,
    peak_rss_mb,
    pid_alive,
    process_env,
    run_onward,
    run_python,
)
from onward.testing.rows import (
    assert_nothing_applied_twice,
    attempts,
    double_transitions,
    effect_row,
    history,
    lost_runs,
    run_effects,
    run_row,
    runs_without_way_forward,
    step_row,
    steps,
    unfinished_runs,
)
from onward.testing.waiting import eventually, eventually_sync, lock_awaited

__all__ = [
    "Process",
    "Processes",
    "TemporaryDatabases",
    "api_key",
    "assert_nothing_applied_twice",
    "attempts",
    "auth",
    "child_pids",
    "cpu_seconds",
    "double_transitions",
    "effect_row",
    "eventually",
    "eventually_sync",
    "free_port",
    "history",
    "libfaketime",
    "loaded_modules",
    "lock_awaited",
    "lost_runs",
    "onward_argv",
    "peak_rss_mb",
    "pid_alive",
    "process_env",
    "run_effects",
    "run_onward",
    "run_python",
    "run_row",
    "runs_without_way_forward",
    "step_row",
    "steps",
    "unfinished_runs",
    "with_database",
    "with_query",
]
