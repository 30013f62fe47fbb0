-- One live session per worker ID across the server instances sharing this
-- database (docs/protocol/connection.md, 496). A row is the claim of the
-- instance holding the session: taken at admission, its lease_until
-- (milliseconds, the database's clock) renewed every few seconds by that
-- instance, deleted on a clean close. Another instance takes a row over
-- only once its lease has run out (the holder died); the holder's own
-- instance may replace a row its release missed. nonce tells one session
-- of the worker ID from the next. status is the session's view (projects,
-- capabilities, host) as JSON, for `gradient worker list` on any instance.
CREATE TABLE worker_sessions (
    worker_id    TEXT   PRIMARY KEY,
    instance_id  TEXT   NOT NULL,
    nonce        TEXT   NOT NULL,
    connected_at BIGINT NOT NULL,
    lease_until  BIGINT NOT NULL,
    status       TEXT   NOT NULL DEFAULT '{}'
);
CREATE INDEX worker_sessions_by_instance ON worker_sessions (instance_id);
