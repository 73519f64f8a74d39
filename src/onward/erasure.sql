-- Erasure (R14). Three kinds of transaction (erasure.py): the record (the erasure row, the
-- contact's runs cancelled and pseudonymised, its suppressions replaced by pseudonyms, the
-- rows outside its runs that name it scrubbed), one per finished run (every row of the run
-- redacted, its history kept as a skeleton plus run_erased), and the finish (done when no run
-- of the contact is left unerased). The record and the finish hold the contact's lock; a start
-- naming the contact holds it shared (check_start), so a start and an erasure are ordered.

-- name: lock_contact
-- The contact's lock, exclusive, for the rest of the transaction (keyed by its pseudonym).
SELECT pg_advisory_xact_lock(hashtextextended('onward.contact:' || %(org_id)s || '/' || %(subject)s, 0));

-- name: lock_contact_shared
-- The contact's lock, shared: a start naming the contact, so it cannot slip past an erasure.
SELECT pg_advisory_xact_lock_shared(hashtextextended('onward.contact:' || %(org_id)s || '/' || %(subject)s, 0));

-- name: erased
-- Whether the contact was erased (or is being erased). Run after the lock: its snapshot sees
-- an erasure that committed while this waited.
SELECT status FROM erasures WHERE org_id = (SELECT %(org_id)s::text) AND subject = %(subject)s;

-- name: contact_runs
-- The contact's runs, by its id as given, in lower case, or by its pseudonym (runs_contact),
-- with their input (the addresses it holds count as the contact's identifiers).
SELECT run_id, input, finished_at IS NOT NULL AS finished, erased_at IS NOT NULL AS erased
FROM runs
WHERE org_id = (SELECT %(org_id)s::text) AND contact_id = ANY(%(ids)s::text[])
ORDER BY run_id;

-- name: record
-- The erasure row: new, or asked again (the pseudonyms of new identifiers join, pending
-- again until the finish finds every run erased).
INSERT INTO erasures AS e (org_id, subject, digests, requested_by)
VALUES (%(org_id)s, %(subject)s, %(digests)s, %(by)s)
ON CONFLICT (org_id, subject) DO UPDATE
SET digests = ARRAY(SELECT DISTINCT d FROM unnest(e.digests || EXCLUDED.digests) AS d ORDER BY d),
    requests = e.requests + 1, status = 'pending', finished_at = NULL, updated_at = now()
RETURNING requested_at, requested_by, requests, (xmax = 0) AS created;

-- name: pseudonymise_runs
-- The contact's runs keep its pseudonym, not its id (runs_contact still finds them); a start
-- key that names an identifier is replaced by one that names only the run. Run after every
-- run was locked by its cancel (lock order: transition lock, timers, step, run row).
UPDATE runs
SET contact_id = %(subject)s, updated_at = now(),
    start_key = CASE
        WHEN EXISTS (SELECT 1 FROM unnest(%(needles)s::text[]) AS n(needle)
                     WHERE strpos(lower(start_key), n.needle) > 0)
        THEN 'erased:' || run_id ELSE start_key END
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY(%(run_ids)s::text[]);

-- name: scrub_unrouted_signals
-- Signals nobody routed to a run (kept until a key is recorded) that name the contact are
-- removed whole: their id, payload and key may all be the contact's. Served by signals_by_key.
DELETE FROM signals
WHERE org_id = (SELECT %(org_id)s::text) AND run_id IS NULL
  AND EXISTS (SELECT 1 FROM unnest(%(needles)s::text[]) AS n(needle)
              WHERE strpos(lower(signal_id || ' ' || coalesce(correlation_key, '') || ' '
                                 || payload::text || ' ' || coalesce(reason, '')), n.needle) > 0);

-- name: scrub_operations
-- A bulk operation whose filter named the contact keeps its filter's shape, not the contact.
UPDATE operations
SET params = params || jsonb_build_object('contact_id', %(marker)s::text), updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND lower(params ->> 'contact_id') = ANY(%(ids)s::text[]);

-- name: scrub_notifications
-- A notification to the customer that names the contact keeps its kind, not its text.
UPDATE notifications
SET subject = %(marker)s, body = jsonb_build_object('redacted', 'erased')
WHERE org_id = (SELECT %(org_id)s::text)
  AND EXISTS (SELECT 1 FROM unnest(%(needles)s::text[]) AS n(needle)
              WHERE strpos(lower(subject || ' ' || body::text), n.needle) > 0);

-- name: lock_run_row
-- The run row, locked after the run's transition lock (nothing else of a finished run moves).
SELECT finished_at IS NOT NULL AS finished, erased_at IS NOT NULL AS erased, contact_id
FROM runs WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
FOR UPDATE;

-- name: redact_timers
-- The run's timers keep their instants, not their intent (a zone, a rule from the input).
UPDATE timers SET intent = jsonb_build_object('redacted', 'erased')
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s;

-- name: redact_steps
-- The run's steps keep their ids, kinds, statuses and times; outputs, the variables they set,
-- errors and wakes go, and the detail of the settle event a step row carries (migration 0029:
-- its history, as redact_history does to history_log's rows).
UPDATE steps
SET output = CASE WHEN output IS NULL THEN NULL ELSE jsonb_build_object('redacted', 'erased') END,
    event_detail = CASE WHEN event_detail IS NULL THEN NULL
                        ELSE jsonb_build_object('redacted', 'erased') END,
    vars = CASE WHEN vars IS NULL THEN NULL ELSE jsonb_build_object('redacted', 'erased') END,
    error = CASE WHEN error IS NULL THEN NULL ELSE jsonb_build_object('redacted', 'erased') END,
    wake = CASE WHEN wake IS NULL THEN NULL ELSE jsonb_build_object('redacted', 'erased') END
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s;

-- name: redact_effects
-- The run's effects keep their keys and statuses (a repeat is still recognised); results and
-- errors go. Served by effects_by_run.
UPDATE effects
SET result = CASE WHEN result IS NULL THEN NULL ELSE jsonb_build_object('redacted', 'erased') END,
    last_error = CASE WHEN last_error IS NULL THEN NULL
                      ELSE jsonb_build_object('redacted', 'erased') END
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s;

-- name: redact_signals
-- The run's signals keep their ids (a redelivery is still a duplicate) and names; payloads,
-- reasons and correlation keys go. Served by signals_by_run.
UPDATE signals
SET payload = jsonb_build_object('redacted', 'erased'), correlation_key = NULL,
    reason = CASE WHEN reason IS NULL THEN NULL ELSE %(marker)s END
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s;

-- name: forget_correlations
-- The keys that routed answers to the run. Served by correlations_by_run.
DELETE FROM correlations WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s;

-- name: redact_approvals
-- The run's approval requests keep who decided what and when; the content shown goes.
UPDATE approvals SET content = %(marker)s
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s;

-- name: redact_history
-- The skeleton of the history stays (events, times, steps, attempts, workers); details go,
-- and one run_erased row says who erased the run (its `at` says when).
WITH redacted AS (
    UPDATE history_log SET detail = jsonb_build_object('redacted', 'erased')
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND detail IS NOT NULL
    RETURNING 1
)
INSERT INTO history_log (org_id, run_id, event, worker, detail)
VALUES (%(org_id)s, %(run_id)s, 'run_erased', %(worker)s,
        jsonb_build_object('by', %(by)s::text, 'erasure', %(subject)s::text,
                           'redacted', (SELECT count(*) FROM redacted)))
RETURNING event_id;

-- name: redact_run
-- The run keeps its automation, version, status and times; input, variables and reason go.
UPDATE runs
SET input = jsonb_build_object('redacted', 'erased'),
    ctx = jsonb_build_object('vars', '{}'::jsonb, 'steps', '{}'::jsonb, 'redacted', 'erased'),
    status_reason = CASE WHEN status_reason IS NULL THEN NULL ELSE %(marker)s END,
    erased_at = now(), updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND erased_at IS NULL;

-- name: remaining
-- The contact's runs not erased yet: finished ones (to erase now) and unfinished ones (a step
-- was in flight: erased once they stop).
SELECT run_id, finished_at IS NOT NULL AS finished FROM runs
WHERE org_id = (SELECT %(org_id)s::text) AND contact_id = %(subject)s AND erased_at IS NULL
ORDER BY run_id;

-- name: finish
-- Every run of the contact is erased: the erasure is done.
UPDATE erasures e
SET status = 'done', finished_at = now(), updated_at = now(),
    runs_erased = (SELECT count(*) FROM runs r
                   WHERE r.org_id = e.org_id AND r.contact_id = e.subject
                     AND r.erased_at IS NOT NULL)
WHERE org_id = (SELECT %(org_id)s::text) AND subject = %(subject)s
RETURNING status, runs_erased, requested_at, requested_by, requests, finished_at;

-- name: pending
-- Erasures waiting on runs that were in flight, oldest first, across organisations (the
-- elected sweeper completes them). Served by erasures_pending.
SELECT org_id, subject, requested_by FROM erasures
WHERE status = 'pending'
ORDER BY requested_at
LIMIT %(limit)s;

-- name: lock_contacts_shared
-- Several contacts' locks, shared (a batch of starts), taken in one order so two batches and an
-- erasure cannot deadlock.
SELECT count(pg_advisory_xact_lock_shared(
           hashtextextended('onward.contact:' || %(org_id)s || '/' || s.subject, 0)))
FROM (SELECT DISTINCT unnest(%(subjects)s::text[]) AS subject ORDER BY 1) s;

-- name: erased_any
-- Which of these contacts were erased (or are being erased). Run after lock_contacts_shared.
SELECT subject FROM erasures WHERE org_id = (SELECT %(org_id)s::text) AND subject = ANY(%(subjects)s::text[]);
