-- Retention (issue 13, Build 6): finished runs and every row of theirs are deleted after the
-- organisation's retention (organisations.retention_days, 0008) by the elected sweeper, in
-- bounded batches (onward.retention). Each table holding a run's rows must be found by the
-- run's id with an index, or every batch would scan it: steps, history, timers and approvals
-- already lead with (org_id, run_id); these three did not.
CREATE INDEX correlations_by_run ON correlations (org_id, run_id);
CREATE INDEX signals_by_run ON signals (org_id, run_id) WHERE run_id IS NOT NULL;
CREATE INDEX effects_by_run ON effects (org_id, run_id);
