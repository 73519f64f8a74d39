-- 0001_core: the durable core. Every table carries org_id and every primary key and hot
-- index leads with it, so the schema can be distributed by org_id. Two deliberate exceptions,
-- all partial indexes over only the pending rows: steps_claimable (workers claim ready work
-- across organisations), steps_leased (the sweep rescues lapsed leases across organisations)
-- and outbox_unsent (the relay drains across organisations). On a
-- distributed database each shard keeps its own copy of those indexes and the claim runs per
-- shard. The state machine is written down in docs/state-machine.md.

CREATE TABLE organisations (
    org_id               text PRIMARY KEY,
    created_at           timestamptz NOT NULL DEFAULT now(),
    -- set when a timer is written, cleared by the sweep when it finds nothing due (R7)
    has_due_work         boolean NOT NULL DEFAULT false,
    -- rotation key of the fair sweep: who was served longest ago leads the next batch
    last_timer_served_at timestamptz
);
CREATE INDEX organisations_due ON organisations (last_timer_served_at NULLS FIRST, org_id)
    WHERE has_due_work;

CREATE TABLE automations (
    org_id         text NOT NULL,
    automation_id  text NOT NULL,
    latest_version integer NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, automation_id)
);

-- Published versions are immutable (R11): rows are inserted, never updated.
CREATE TABLE automation_versions (
    org_id        text NOT NULL,
    automation_id text NOT NULL,
    version       integer NOT NULL CHECK (version > 0),
    digest        text NOT NULL,       -- sha256 of the canonical document
    document      jsonb NOT NULL,
    -- what a start needs, resolved at publish time so a start is one statement:
    start_step_id text NOT NULL,
    start_kind    text NOT NULL,
    start_lane    text NOT NULL,
    max_steps     integer NOT NULL,
    max_age_s     double precision NOT NULL,
    published_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, automation_id, version)
);
-- Not unique: publishing an older document again makes it current as a new version.
CREATE INDEX automation_versions_digest ON automation_versions (org_id, automation_id, digest);

CREATE TABLE runs (
    org_id          text NOT NULL,
    run_id          text NOT NULL,
    automation_id   text NOT NULL,
    version         integer NOT NULL,
    start_key       text NOT NULL,      -- provider event id, else payload hash (R1)
    start_key_kind  text NOT NULL CHECK (start_key_kind IN ('event', 'payload_hash', 'caller')),
    status          text NOT NULL CHECK (status IN (
        'active',       -- one step is ready or running
        'waiting',      -- its step waits on a timer, a signal or a person
        'parked',       -- needs a person: review, reconnect, open circuit
        'completed',    -- terminal: reached the end of the graph
        'failed',       -- terminal: a step failed for good
        'cancelled',    -- terminal: cancelled by a person or by erasure
        'exceeded'      -- terminal: over its budget of steps or age (R13)
    )),
    status_reason   text,
    input           jsonb NOT NULL DEFAULT '{}',
    ctx             jsonb NOT NULL DEFAULT '{}',  -- {"vars": {...}, "steps": {step_id: output}}
    visits          jsonb NOT NULL DEFAULT '{}',  -- step_id -> times entered (loop iteration)
    current_seq     integer NOT NULL DEFAULT 0,
    steps_executed  integer NOT NULL DEFAULT 0,
    max_steps       integer NOT NULL,
    deadline_at     timestamptz NOT NULL,         -- created_at + max age (R13)
    contact_id      text,                         -- the person this run is about (R14)
    cancel_requested_at timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    PRIMARY KEY (org_id, run_id),
    UNIQUE (org_id, start_key)
);
CREATE INDEX runs_listing ON runs (org_id, created_at DESC);
CREATE INDEX runs_unfinished ON runs (org_id, status) WHERE finished_at IS NULL;
CREATE INDEX runs_waiting_deadline ON runs (org_id, deadline_at) WHERE status IN ('waiting', 'parked');

-- One row per entry of a run into a step: a loop that passes a step three times has three rows.
-- A run has at most one unfinished step at a time (the walk is linear).
CREATE TABLE steps (
    org_id       text NOT NULL,
    run_id       text NOT NULL,
    seq          integer NOT NULL,        -- position in the run's walk: 1, 2, 3, ...
    step_id      text NOT NULL,           -- stable id from the automation document
    kind         text NOT NULL,
    lane         text NOT NULL,
    iteration    integer NOT NULL DEFAULT 1,  -- nth entry into step_id; part of effect keys
    status       text NOT NULL CHECK (status IN (
        'ready',      -- claimable once available_at has passed
        'running',    -- claimed: owner holds the lease until lease_until, fenced by attempt
        'waiting',    -- parked on a timer / signal / approval; woken by that row
        'parked',     -- needs a person (review, reconnect); resumed by the API
        'done',       -- terminal: settled by the newest attempt
        'failed',     -- terminal
        'skipped',    -- terminal: e.g. consent refused at send time (R14)
        'cancelled'   -- terminal
    )),
    attempt      integer NOT NULL DEFAULT 0,  -- fencing token: incremented by every claim (R3)
    owner        text,
    lease_until  timestamptz,
    available_at timestamptz NOT NULL DEFAULT now(),  -- retry backoff / not before
    wait_kind    text CHECK (wait_kind IN ('timer', 'signal', 'approval', 'review', 'reconnect', 'circuit')),
    wake         jsonb,                   -- what woke a waiting step (timer id, signal id)
    output       jsonb,
    error        jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (org_id, run_id, seq)
);
CREATE INDEX steps_claimable ON steps (lane, available_at) WHERE status = 'ready';
CREATE INDEX steps_leased ON steps (lease_until) WHERE status = 'running';
CREATE UNIQUE INDEX steps_one_unfinished ON steps (org_id, run_id)
    WHERE status IN ('ready', 'running', 'waiting', 'parked');

CREATE TABLE timers (
    org_id     text NOT NULL,
    timer_id   bigint GENERATED ALWAYS AS IDENTITY,
    run_id     text NOT NULL,
    seq        integer NOT NULL,          -- the waiting step it wakes
    purpose    text NOT NULL CHECK (purpose IN ('wait', 'deadline', 'retry')),
    intent     jsonb NOT NULL,            -- what was asked: {"duration": "2s"} or rule + IANA zone (R6)
    due_at     timestamptz NOT NULL,      -- the computed UTC instant the sweep compares with now()
    wake_n     integer NOT NULL DEFAULT 1, -- bumped on recompute; part of the wake job id (R16)
    fired_at   timestamptz,               -- set once, by whoever fires it first (sweep or wake)
    fired_by   text,                      -- 'sweep' | 'wake' | 'signal' (lost to a signal)
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, timer_id)
);
CREATE INDEX timers_due ON timers (org_id, due_at) WHERE fired_at IS NULL;
CREATE INDEX timers_by_step ON timers (org_id, run_id, seq);

-- Outside effects (R4). The key names the effect, never the attempt:
-- "<run_id>/<step_id>/<iteration>". Its lease is separate from the step's lease.
CREATE TABLE effects (
    org_id           text NOT NULL,
    effect_key       text NOT NULL,
    run_id           text NOT NULL,
    seq              integer NOT NULL,
    provider         text NOT NULL,
    status           text NOT NULL CHECK (status IN (
        'in_flight',        -- a worker may be calling the provider right now (owner_token, lease_until)
        'outcome_unknown',  -- a call began and its lease lapsed or it failed ambiguously
        'settled',          -- the provider's result is recorded; replays return it
        'review'            -- parked for a person: no safe way to retry
    )),
    owner_token      integer NOT NULL DEFAULT 0,  -- bumped by every begin-attempt
    lease_until      timestamptz,
    attempts         integer NOT NULL DEFAULT 0,
    first_attempt_at timestamptz,
    last_attempt_at  timestamptz,
    result           jsonb,
    last_error       jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    settled_at       timestamptz,
    PRIMARY KEY (org_id, effect_key)
);
CREATE INDEX effects_unsettled ON effects (org_id, lease_until) WHERE status IN ('in_flight', 'outcome_unknown');

-- Transactional outbox (R2): written in the same transaction as the transition it announces.
CREATE TABLE outbox (
    org_id     text NOT NULL,
    outbox_id  bigint GENERATED ALWAYS AS IDENTITY,
    topic      text NOT NULL,             -- 'step' (a step became ready) | 'timer' (a timer is due)
    job_id     text NOT NULL,             -- queue job id; wake ids carry attempt/wake number (R16)
    lane       text NOT NULL,
    payload    jsonb NOT NULL,
    deliver_at timestamptz NOT NULL DEFAULT now(),  -- delayed wake for a timer's due instant
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz,
    PRIMARY KEY (org_id, outbox_id)
);
CREATE INDEX outbox_unsent ON outbox (deliver_at, outbox_id) WHERE sent_at IS NULL;

-- Ordered, append-only log of every transition of a run (R17), written in the transition's
-- own transaction. event_id orders it; at is the database clock.
CREATE TABLE history (
    org_id    text NOT NULL,
    run_id    text NOT NULL,
    event_id  bigint GENERATED ALWAYS AS IDENTITY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    event     text NOT NULL,
    seq       integer,
    step_id   text,
    attempt   integer,
    worker    text,
    detail    jsonb,
    PRIMARY KEY (org_id, run_id, event_id)
);

-- Leader election for singletons (the sweeper): a short renewable lease row.
CREATE TABLE leader_leases (
    org_id      text NOT NULL DEFAULT '_system',
    name        text NOT NULL,
    holder      text NOT NULL,
    term        bigint NOT NULL DEFAULT 1,   -- fencing token of the leadership
    lease_until timestamptz NOT NULL,
    PRIMARY KEY (org_id, name)
);
