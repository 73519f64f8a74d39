-- 0030: a step that only moves its run along leaves the run's row alone (issue 16).
--
-- A settle wrote the run's row at every step: its variables, its visit counts, its position
-- (current_seq) and its step count -- a new version of a ~350-byte row and ~230 bytes of WAL
-- a step, with its step row carrying the same variables already (vars, migration 0029). Now
-- a settle that enters the next step eagerly (claimed by the same worker, in the same
-- statement), keeps no output for the run and leaves its run active writes only step rows
-- (leases.sql settle_advance). The run's row is then *behind*: its ctx, visits,
-- steps_executed and current_seq are as they were when its step `current_seq` was current,
-- and the steps since carry the rest -- each settled one its variables, each entered one its
-- id and iteration.
--
-- The rule that keeps this safe: a run's row is behind only while its current step is
-- `running`, entered by such a settle. Every transition that takes a step out of 'running'
-- catches the row up in the same statement (settle_advance when it writes the run,
-- settle_wait_timer, settle_stop, settle_cancel_requested, and the retry, deferral, release
-- and rescue through the fragment fold_ready), so a worker that claims a ready step, a timer
-- that wakes a waiting one, a migration, a cancel and an erasure all read a row that is
-- current. What reads a run while its step runs -- the run's screen, the API, the lists --
-- reads it through onward_run_now.

-- The run as it is when its step `upto` is current: its row with the steps since
-- current_seq folded in -- the variables of the steps settled before `upto` (in order: a
-- later step's value wins, as the settle's merge did), the id and iteration of each step
-- entered after current_seq, one step counted for each settled. No row changes: a caller that
-- writes the result catches the run's row up. `upto` at or before current_seq: the row as it is.
CREATE FUNCTION onward_fold(r runs, upto integer, OUT ctx jsonb, OUT visits jsonb,
                            OUT steps_executed integer, OUT current_seq integer)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN v.vars = '{}'::jsonb THEN r.ctx
                ELSE jsonb_set(r.ctx, '{vars}', coalesce(r.ctx -> 'vars', '{}'::jsonb) || v.vars)
           END,
           r.visits || n.visits,
           r.steps_executed + greatest(upto - r.current_seq, 0),
           greatest(r.current_seq, upto)
    FROM (SELECT coalesce(jsonb_object_agg(e.key, e.value ORDER BY s.seq), '{}'::jsonb) AS vars
          FROM steps s CROSS JOIN LATERAL jsonb_each(s.vars) AS e
          WHERE s.org_id = r.org_id AND s.run_id = r.run_id
            AND s.seq >= r.current_seq AND s.seq < upto) AS v,
         (SELECT coalesce(jsonb_object_agg(s.step_id, to_jsonb(s.iteration) ORDER BY s.seq),
                          '{}'::jsonb) AS visits
          FROM steps s
          WHERE s.org_id = r.org_id AND s.run_id = r.run_id
            AND s.seq > r.current_seq AND s.seq <= upto) AS n
$$;

-- The run as it is now: folded up to its latest step (what a reader shows; a row that is
-- current comes back as it is, after one probe of steps_pkey).
CREATE FUNCTION onward_run_now(r runs, OUT ctx jsonb, OUT visits jsonb,
                               OUT steps_executed integer, OUT current_seq integer)
LANGUAGE sql STABLE AS $$
    SELECT f.ctx, f.visits, f.steps_executed, f.current_seq
    FROM onward_fold(r, coalesce((SELECT max(s.seq) FROM steps s
                                  WHERE s.org_id = r.org_id AND s.run_id = r.run_id),
                                 r.current_seq)) AS f
$$;

