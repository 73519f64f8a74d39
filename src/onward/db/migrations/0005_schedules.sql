-- 0005: schedules that start runs (issue 10). An automation document may carry schedules; each
-- publish syncs this table in the version's own transaction, and the elected sweeper fires the
-- due ones: every firing starts a run with the start key
-- `<automation_id>:schedule:<schedule_id>:<instant>`, so a repeat is a duplicate, never a
-- second run. The states and transitions are in docs/state-machine.md ("Schedule").

CREATE TABLE schedules (
    org_id           text NOT NULL,
    automation_id    text NOT NULL,             -- the automation whose document defines it
    schedule_id      text NOT NULL,             -- its id in that document (stable across edits)
    version          integer NOT NULL,          -- the automation version that last synced it
    rule             text NOT NULL,             -- the calendar rule as written (onward.calendar)
    zone             text NOT NULL,             -- the IANA zone whose wall clock the rule reads
    start_at         timestamptz,               -- no instant before this one (NULL: from publish)
    end_at           timestamptz,               -- no instant after this one (NULL: no end)
    jitter_s         double precision NOT NULL DEFAULT 0 CHECK (jitter_s >= 0),  -- spread of fire times
    overlap          text NOT NULL CHECK (overlap IN (
        'skip',         -- a run of this schedule is unfinished: the firing is skipped (recorded)
        'allow',        -- runs may overlap
        'buffer_one'    -- keep one pending firing, started when the unfinished run finishes
    )),
    catch_up         text NOT NULL CHECK (catch_up IN (
        'skip',         -- missed firings are dropped; the next is the next future one
        'latest',       -- only the most recent missed firing runs
        'all'           -- every missed firing runs, oldest first, at most 100
    )),
    input            jsonb NOT NULL DEFAULT '{}',  -- merged into every run's input
    paused           boolean NOT NULL DEFAULT false,  -- a paused schedule fires nothing
    paused_at        timestamptz,               -- when it was paused (NULL: not paused)
    next_instant     timestamptz,               -- the rule's next instant: the next firing's identity (NULL: none left)
    next_fire_at     timestamptz,               -- when the sweep acts next: next_instant + its jitter offset, or now while a buffered firing waits (NULL: nothing to do)
    buffered_instant timestamptz,               -- buffer_one: the one firing kept until the unfinished run finishes
    last_instant     timestamptz,               -- the instant of the last firing the sweep handled
    last_outcome     text CHECK (last_outcome IN (
        'started',      -- the firing started its run
        'duplicate',    -- its run already existed (a repeat after a crash): nothing new
        'skipped',      -- overlap skip, or buffer_one with its buffer full
        'buffered',     -- buffer_one kept it for later
        'missed',       -- the catch-up policy dropped it (the sweeper was down or behind)
        'triggered',    -- a person fired it now (trigger)
        'failed'        -- its run could not be started (see error)
    )),
    last_fired_at    timestamptz,               -- when a firing last started a run (database clock)
    last_run_id      text,                      -- the run the last firing started: overlap checks whether it is unfinished
    fired_count      integer NOT NULL DEFAULT 0,   -- firings that started a run
    skipped_count    integer NOT NULL DEFAULT 0,   -- firings skipped by overlap or dropped by catch-up
    error            text,                      -- why the last firing failed, or why the schedule stopped (its rule failed to compute)
    created_at       timestamptz NOT NULL DEFAULT now(),  -- first published
    updated_at       timestamptz NOT NULL DEFAULT now(),  -- last written (publish, fire, pause, resume, trigger)
    PRIMARY KEY (org_id, automation_id, schedule_id)
);

-- The due sweep: per organisation, the active schedules by when they act next. Its org_id
-- prefix also lets the sweep step from one organisation with schedules to the next (a skip
-- scan), so organisations without schedules cost nothing.
CREATE INDEX schedules_due ON schedules (org_id, next_fire_at)
    WHERE NOT paused AND next_fire_at IS NOT NULL;
