-- Renewing a host lease marks its host seen and online, inside the renewing statement
-- itself, so a renew tick is one statement however many hosts it covers
-- (docs/CLUSTER.md, "Ownership: the host lease"). PostgreSQL does the same
-- with a data-modifying CTE and needs no trigger.
CREATE TRIGGER leases_renewal_touches_host
AFTER UPDATE OF expires_at ON leases
WHEN NEW.key LIKE 'host:%' AND NEW.holder = OLD.holder
BEGIN
    UPDATE hosts SET last_seen_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), state = 'online'
    WHERE id = substr(NEW.key, 6);
END;
