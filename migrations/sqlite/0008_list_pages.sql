-- Pages of hosts, terminals and runs are read in creation order after a cursor (docs/REST.md, "Lists"): these
-- indexes let a page read its own rows instead of sorting all of a user's hosts, terminals or runs.
CREATE INDEX hosts_user_created ON hosts(user_id, created_at, id);
CREATE INDEX terminals_user_created ON terminals(user_id, created_at, id);
CREATE INDEX runs_user_created ON runs(user_id, created_at, id);
-- The new terminals and runs indexes start with the same columns as these.
DROP INDEX terminals_user;
DROP INDEX runs_user;
