-- 0027: room on each outbox page for a row's sent version (issue 16). The relay locks a row
-- (FOR UPDATE SKIP LOCKED) and marks it sent; on a full page the new version moved to another
-- page, which writes the whole row again and a lock record for the move. With half of each page
-- left free the new version stays beside the old one: on a 3-step drain, outbox WAL fell from
-- ~103 to ~45 bytes a step (the closing note of issue 16). Outbox rows are pruned once sent
-- (prune_sent), so the price in disk is small and passing. Only pages written from now on use
-- the setting; nothing is rewritten.
ALTER TABLE outbox SET (fillfactor = 50);
