-- Cost budgets (R5, the slow lane): per day (UTC), for the organisation (scope '*') or one
-- automation, in usd or tokens. Use = the day's charges + the live reservations. A
-- reservation has a lease: one whose worker died between reserve and settle stops counting
-- when its lease lapses, so no budget leaks for ever.

-- name: of_scopes
-- The budgets that apply to a call of this automation.
SELECT scope, unit, per_day FROM budgets
WHERE org_id = (SELECT %(org_id)s::text) AND scope IN ('*', %(automation_id)s)
ORDER BY scope, unit;

-- name: lock_budget
-- Serialise reservations of one budget for the rest of the transaction.
SELECT pg_advisory_xact_lock(
    hashtextextended('onward.budget:' || %(org_id)s || '/' || %(scope)s || '/' || %(unit)s, 0));

-- name: reserve
-- Reserve %(amount)s for this effect if the day's charges, the other live reservations and it
-- fit in the budget; answers reserved = false (and the use) when they do not.
WITH use AS (
    SELECT coalesce((SELECT sum(amount) FROM budget_charges
                     WHERE org_id = (SELECT %(org_id)s::text) AND scope = %(scope)s AND unit = %(unit)s
                       AND day = (now() AT TIME ZONE 'UTC')::date), 0) AS charged,
           coalesce((SELECT sum(amount) FROM budget_reservations
                     WHERE org_id = (SELECT %(org_id)s::text) AND scope = %(scope)s AND unit = %(unit)s
                       AND lease_until > now() AND effect_key <> %(effect_key)s), 0) AS reserved
),
ins AS (
    INSERT INTO budget_reservations (org_id, effect_key, scope, unit, amount, lease_until)
    SELECT %(org_id)s, %(effect_key)s, %(scope)s, %(unit)s, %(amount)s,
           now() + make_interval(secs => %(lease)s)
    FROM use WHERE use.charged + use.reserved + %(amount)s <= %(per_day)s
    ON CONFLICT (org_id, effect_key, scope, unit) DO UPDATE
    SET amount = EXCLUDED.amount, lease_until = EXCLUDED.lease_until
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM ins) AS reserved, use.charged, use.reserved AS others FROM use;

-- name: charge
-- The call's real cost, charged once per effect key (a replay of a settled effect charges
-- nothing again), and its reservations released, in one statement.
WITH freed AS (
    DELETE FROM budget_reservations
    WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s
    RETURNING scope, unit
)
INSERT INTO budget_charges (org_id, effect_key, scope, unit, day, amount)
SELECT %(org_id)s, %(effect_key)s, b.scope, b.unit, (now() AT TIME ZONE 'UTC')::date,
       CASE WHEN b.unit = 'usd' THEN %(usd)s::numeric ELSE %(tokens)s::numeric END
FROM budgets b
WHERE b.org_id = (SELECT %(org_id)s::text) AND b.scope IN ('*', %(automation_id)s)
ON CONFLICT (org_id, effect_key, scope, unit) DO NOTHING;

-- name: release
-- The call was not made (or its outcome is not a cost): give the reservations back.
DELETE FROM budget_reservations WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s;

-- name: set_budget
-- Set a budget (per day); resuming the steps parked on budgets follows.
INSERT INTO budgets (org_id, scope, unit, per_day)
VALUES (%(org_id)s, %(scope)s, %(unit)s, %(per_day)s)
ON CONFLICT (org_id, scope, unit) DO UPDATE SET per_day = EXCLUDED.per_day, updated_at = now()
RETURNING scope, unit, per_day;

-- name: resume_parked
-- Steps parked on a budget become ready again (same step, next attempt) -- of one
-- organisation when a budget was set, or, for the sweeper, those parked before today (UTC):
-- their budget renewed. Each reserves again when it runs, and parks again if it still does not
-- fit. Bounded.
WITH picked AS (
    SELECT org_id, run_id, seq FROM steps
    WHERE status = 'parked' AND wait_kind = 'budget'
      AND (%(org_id)s::text IS NULL OR org_id = (SELECT %(org_id)s::text))
      AND (NOT %(renewed_only)s
           OR (updated_at AT TIME ZONE 'UTC')::date < (now() AT TIME ZONE 'UTC')::date)
    ORDER BY updated_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
to_ready AS (
    SELECT org_id, run_id, seq, 'parked' AS from_status, NULL::int AS attempt,
           now() AS available_at, jsonb_build_object('by', 'budget') AS wake,
           NULL::jsonb AS error, 'step_resumed' AS event, %(worker)s::text AS worker,
           jsonb_build_object('by', 'budget', 'reason', %(reason)s::text) AS detail
    FROM picked
),
{{make_ready}},
run AS (
    UPDATE runs r SET status = 'active', status_reason = NULL, updated_at = now()
    FROM ready
    WHERE r.org_id = ready.org_id AND r.run_id = ready.run_id AND r.status = ready.from_status
)
SELECT count(*) AS resumed FROM ready;

-- name: resume_with_room
-- The sweeper's backstop: a step parked on a budget (its error names the budget, the unit and
-- the call's maximum cost) becomes ready again once that budget has room for it -- its
-- reservations released or lapsed, a charge below its estimate, or a raise that committed
-- between the step's failed reservation and its park (set_budget's resume ran before the park
-- and missed it). Oldest first, as many as fit together in each budget's room (a deleted
-- budget: all); a call too big for the room alone is passed over. Each reserves again when it runs. Bounded; served by steps_parked.
WITH parked AS (
    SELECT org_id, run_id, seq, updated_at,
           error -> 'detail' ->> 'budget' AS scope, error -> 'detail' ->> 'unit' AS unit,
           (error -> 'detail' ->> 'cost')::numeric AS cost
    FROM steps
    WHERE status = 'parked' AND wait_kind = 'budget'
      AND jsonb_typeof(error -> 'detail' -> 'cost') = 'number'
),
room AS (
    SELECT b.org_id, b.scope, b.unit,
           b.per_day
           - coalesce((SELECT sum(amount) FROM budget_charges c
                       WHERE c.org_id = b.org_id AND c.scope = b.scope AND c.unit = b.unit
                         AND c.day = (now() AT TIME ZONE 'UTC')::date), 0)
           - coalesce((SELECT sum(amount) FROM budget_reservations r
                       WHERE r.org_id = b.org_id AND r.scope = b.scope AND r.unit = b.unit
                         AND r.lease_until > now()), 0) AS room
    FROM budgets b
    WHERE (b.org_id, b.scope, b.unit) IN (SELECT org_id, scope, unit FROM parked)
),
fitting AS (
    SELECT p.org_id, p.run_id, p.seq, room.room,
           sum(p.cost) OVER (PARTITION BY p.org_id, p.scope, p.unit
                             ORDER BY p.updated_at, p.run_id, p.seq) AS upto
    FROM parked p
    LEFT JOIN room ON room.org_id = p.org_id AND room.scope = p.scope AND room.unit = p.unit
    WHERE room.room IS NULL OR p.cost <= room.room  -- one too big alone holds back no other
),
to_ready AS (
    SELECT org_id, run_id, seq, 'parked' AS from_status, NULL::int AS attempt,
           now() AS available_at, jsonb_build_object('by', 'budget') AS wake,
           NULL::jsonb AS error, 'step_resumed' AS event, %(worker)s::text AS worker,
           jsonb_build_object('by', 'budget', 'reason', 'room in the budget') AS detail
    FROM fitting
    WHERE room IS NULL OR upto <= room
    ORDER BY upto
    LIMIT %(limit)s
),
{{make_ready}},
run AS (
    UPDATE runs r SET status = 'active', status_reason = NULL, updated_at = now()
    FROM ready
    WHERE r.org_id = ready.org_id AND r.run_id = ready.run_id AND r.status = ready.from_status
)
SELECT count(*) AS resumed FROM ready;

-- name: list
-- Every budget with today's charges and live reservations.
SELECT b.scope, b.unit, b.per_day,
       coalesce((SELECT sum(amount) FROM budget_charges c
                 WHERE c.org_id = b.org_id AND c.scope = b.scope AND c.unit = b.unit
                   AND c.day = (now() AT TIME ZONE 'UTC')::date), 0) AS charged_today,
       coalesce((SELECT sum(amount) FROM budget_reservations r
                 WHERE r.org_id = b.org_id AND r.scope = b.scope AND r.unit = b.unit
                   AND r.lease_until > now()), 0) AS reserved,
       (SELECT count(*) FROM steps st
        WHERE st.org_id = b.org_id AND st.status = 'parked' AND st.wait_kind = 'budget') AS parked
FROM budgets b WHERE b.org_id = (SELECT %(org_id)s::text) ORDER BY b.scope, b.unit;
