-- 0026: room on each page for a run's and a step's next version (issue 16). A step's settle
-- updates its run (variables, visits, counters) and changes no indexed column until the run
-- finishes: with room on the page the new version is a heap-only tuple (HOT), which writes no
-- entry into any of the run's indexes and no lock record for a move to another page. Measured
-- on a 3-step drain (the closing note of issue 16): with both tables full (fillfactor 100),
-- 10-35% of those run updates were HOT; with 50 and 70, 63-92%, and 10-20% less WAL a step.
-- A step row is updated once or twice (claimed, settled); room on its page keeps the new
-- version beside the old one, so its WAL record is smaller and no lock record is written.
-- The price is disk: runs and steps pages are filled to half and 70% on insert.
-- Only pages written from now on use the new setting; no table is rewritten.
ALTER TABLE runs SET (fillfactor = 50);
ALTER TABLE steps SET (fillfactor = 70);
