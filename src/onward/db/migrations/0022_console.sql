-- The console's run list (issue 15): newest first, keyset paging on (created_at, run_id), filtered
-- by status, automation (and version), contact, parked reason and a time range -- fast at a
-- million runs. Each filter the list offers has an index whose order is the page's order, so a
-- page is an index range scan of its own length (no sort of every matching run):
--   runs_page               no filter, or a time range (replaces runs_listing, its prefix);
--   runs_page_by_status     a status (parked reasons: status 'parked' + the step's wait_kind);
--   runs_page_by_automation an automation (a version is checked on the rows it reads).
-- A contact's runs are few: runs_contact finds them and the page sorts them.
DROP INDEX runs_listing;
CREATE INDEX runs_page ON runs (org_id, created_at, run_id);
CREATE INDEX runs_page_by_status ON runs (org_id, status, created_at, run_id);
CREATE INDEX runs_page_by_automation ON runs (org_id, automation_id, created_at, run_id);
-- The health page's last hour (R18), for one organisation: timers fired per minute (lateness)
-- and effects claimed per minute (unsettled over time). Each row gets one more index entry,
-- once: when its timer fires, when its effect is first claimed.
CREATE INDEX timers_fired ON timers (org_id, fired_at) WHERE fired_at IS NOT NULL;
CREATE INDEX effects_recent ON effects (org_id, created_at);
