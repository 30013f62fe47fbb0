-- Several server processes on one PostgreSQL database (README "Several
-- instances"). SQLite keeps one process; the tables exist there too so
-- that both engines run one set of queries.
--
-- server_instances: one row per running server process, renewed while it
-- runs (lease_until) and deleted when it stops cleanly; a row whose lease
-- has passed belongs to a process that died. fingerprint is JSON of
-- {setting: hash} of the configuration every instance must share (never
-- a secret, only its hash). Times are milliseconds of the database's clock.
CREATE TABLE server_instances (
    id          TEXT   PRIMARY KEY,
    host        TEXT   NOT NULL,
    addr        TEXT   NOT NULL,
    pid         BIGINT NOT NULL,
    version     TEXT   NOT NULL,
    fingerprint TEXT   NOT NULL,
    started_at  BIGINT NOT NULL,
    renewed_at  BIGINT NOT NULL,
    lease_until BIGINT NOT NULL
);

-- The cluster's configuration fingerprint: the last one an instance
-- started with, so a new instance is checked even while none runs.
CREATE TABLE server_cluster (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    fingerprint TEXT    NOT NULL,
    set_by      TEXT    NOT NULL,
    set_at      BIGINT  NOT NULL
);

-- leases: "one instance at a time" for the server's singletons (a
-- branch's poll, a garbage collection); see storage/leases.go.
CREATE TABLE leases (
    name        TEXT   PRIMARY KEY,
    owner       TEXT   NOT NULL,
    acquired_at BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);

-- The forge status poster claims the outbox rows it posts, so each status
-- is posted by one instance: claimed_until (Go clock, milliseconds) ends
-- a claim whose poster died.
ALTER TABLE forge_statuses ADD COLUMN claimed_by TEXT;
ALTER TABLE forge_statuses ADD COLUMN claimed_until BIGINT NOT NULL DEFAULT 0;
