-- 0006: people in the loop (R9, R10). Signals with a unique identity, routed by correlation
-- keys recorded when the answered thing was created; approvals with single-use button tokens,
-- a permission table checked at click time, and deadlines.

-- A key chosen when the thing a person may answer was created (the email's message id), that
-- leads an answer back to its run. Recording one adopts the signals that arrived before it.
CREATE TABLE correlations (
    org_id     text NOT NULL,
    key        text NOT NULL,              -- e.g. 'email:msg_4f2a'
    run_id     text NOT NULL,
    seq        integer NOT NULL,           -- the step that created the answered thing
    step_id    text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, key)
);

-- One row per logical signal: its identity is the sender's event id, so a transport duplicate
-- is the same row (deliveries counts them). Kept until a step consumes it: a signal that comes
-- before its step waits is consumed when the step arrives, with no window that expires.
CREATE TABLE signals (
    org_id          text NOT NULL,
    signal_id       text NOT NULL,         -- the sender's unique identity (provider event id)
    name            text NOT NULL,         -- what it means: 'reply', 'unsubscribe', ...
    correlation_key text,                  -- how it was routed (NULL: addressed to a run)
    run_id          text,                  -- the run it belongs to; NULL: nobody can route it
    status          text NOT NULL CHECK (status IN (
        'pending',   -- stored; waits for a step of its run to wait on it (or for a route)
        'consumed',  -- a waiting step took it (seq), in the transaction that woke the step
        'refused',   -- its run had finished or was cancelled (reason)
        'late'       -- the deadline of the step that waited on it won the race (reason)
    )),
    payload         jsonb NOT NULL DEFAULT '{}',
    reason          text,
    seq             integer,               -- the step that consumed it
    deliveries      integer NOT NULL DEFAULT 1,
    received_at     timestamptz NOT NULL DEFAULT now(),
    consumed_at     timestamptz,
    PRIMARY KEY (org_id, signal_id)
);
CREATE INDEX signals_pending ON signals (org_id, run_id, name, received_at)
    WHERE status = 'pending';
CREATE INDEX signals_by_key ON signals (org_id, correlation_key) WHERE run_id IS NULL;

-- A waiting step names the signals it takes (wait_signal); kept after it ends, for history.
ALTER TABLE steps ADD COLUMN signals text[];

-- One row per request for a decision. Its buttons carry a token naming the approval and its
-- nonce; the first decision moves status off 'pending' and wakes the step, both in one
-- transaction; a second reads it back.
CREATE TABLE approvals (
    org_id       text NOT NULL,
    approval_id  text NOT NULL,            -- '<run_id>/<step_id>/<iteration>/<request>'
    run_id       text NOT NULL,
    seq          integer NOT NULL,
    step_id      text NOT NULL,
    request      integer NOT NULL,         -- 1, 2, ...: an escalation or changed content
    digest       text NOT NULL,            -- sha256 of the content shown: the decision binds it
    content      text NOT NULL,
    approvers    text[] NOT NULL,          -- who is asked (and may decide, if still granted)
    channel      text,
    nonce        text NOT NULL,            -- in every token of this request
    status       text NOT NULL CHECK (status IN (
        'pending', 'approved', 'rejected',
        'expired',     -- its deadline passed with no decision
        'superseded',  -- the content changed, or the request was escalated: a new request
        'cancelled'    -- its run ended
    )),
    decided_by   text,
    decided_via  text,                     -- 'slack' | 'api' | 'default'
    decided_at   timestamptz,
    deadline_at  timestamptz NOT NULL,
    message_ts   text,                     -- the Slack message that asks
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, approval_id)
);
CREATE UNIQUE INDEX approvals_one_pending ON approvals (org_id, run_id, seq)
    WHERE status = 'pending';
CREATE INDEX approvals_by_step ON approvals (org_id, run_id, seq, request);

-- Who may decide, checked when the button is pressed (not when the message was sent).
CREATE TABLE approvers (
    org_id     text NOT NULL,
    approver   text NOT NULL,              -- a Slack user id (or any id the API names)
    scope      text NOT NULL DEFAULT '*',  -- an automation id, or '*' for every automation
    granted_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    PRIMARY KEY (org_id, approver, scope)
);

-- Secrets the engine makes for itself (the key that signs approval tokens) when none is
-- configured: shared by every process of the engine through the database.
CREATE TABLE engine_secrets (
    org_id     text NOT NULL DEFAULT '_system',
    name       text NOT NULL,
    secret     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, name)
);

-- A Slack connection's signing secret: interactivity requests are verified with it.
ALTER TABLE connections ADD COLUMN signing_secret text;

ALTER TABLE history DROP CONSTRAINT history_event_known;
ALTER TABLE history ADD CONSTRAINT history_event_known CHECK (event IN (
    'run_started',      -- start_run: a new run and its first step
    'start_duplicate',  -- find_duplicate: a repeated delivery was acknowledged
    'step_ready',       -- a step may be claimed (new, or back after a retry, wake or resume)
    'step_claimed',     -- a worker took the step's lease; attempt = its fencing token
    'step_done',        -- the step settled with its output
    'step_skipped',     -- the step did nothing on purpose (e.g. consent refused)
    'step_waiting',     -- the step waits on a timer, a signal or a person (detail: on what)
    'step_retry',       -- a retryable failure: ready again after the backoff
    'step_released',    -- graceful shutdown handed the step back
    'lease_expired',    -- the sweeper found the lease lapsed and made the step ready
    'timer_fired',      -- a timer fired (by its wake or the sweep) and woke its step
    'timer_moved',      -- a pending timer was recomputed: old and new instants, new wake_n
    'signal_consumed',  -- a signal woke its waiting step (the deadline lost, if it had one)
    'signal_refused',   -- a signal came for a finished or cancelled run
    'signal_late',      -- a signal came after the deadline of the step that waited on it won
    'approval_requested', -- a decision was asked for (content digest, approvers, deadline)
    'approval_decided', -- the first decision: it woke the step
    'approval_refused', -- a click or call that decided nothing (expired, revoked, stale, ...)
    'approval_expired', -- the deadline passed with no decision (then the policy applies)
    'step_resumed',     -- a parked step is ready again (its connection was restored)
    'step_parked',      -- the step needs a person (review, reconnect)
    'step_failed',      -- the step failed for good
    'step_cancelled',   -- the step ended because its run was cancelled or exceeded
    'run_parked',       -- the run waits for a person
    'run_completed',    -- terminal: the run reached the end of its graph
    'run_failed',       -- terminal: a step failed for good
    'run_cancelled',    -- terminal: cancelled on request
    'run_exceeded'      -- terminal: over its budget of steps or age (R13)
));
