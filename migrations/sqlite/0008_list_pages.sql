-- Pages of hosts are read in creation order after a cursor (docs/REST.md, "Lists"): this index lets a page
-- read its own rows instead of sorting all of a user's hosts. Terminals and runs have one already
-- (terminals_user, runs_user); SQLite ends every index with the rowid, the order of rows created in the
-- same millisecond.
CREATE INDEX hosts_user_created ON hosts(user_id, created_at);
