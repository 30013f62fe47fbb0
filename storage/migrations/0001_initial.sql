-- Gradient server schema, version 1: teams, projects, caches and the
-- credentials workers authenticate with.
--
-- Portable between SQLite and PostgreSQL: IDs are canonical lowercase UUID
-- text, times are BIGINT unix milliseconds (UTC), flags are BOOLEAN.

CREATE TABLE teams (
    id         TEXT   PRIMARY KEY,
    name       TEXT   NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);

-- A team's projects must be deleted before the team (RESTRICT): they own
-- history that should not vanish with a mistyped team deletion.
CREATE TABLE projects (
    id         TEXT   PRIMARY KEY,
    team_id    TEXT   NOT NULL REFERENCES teams (id) ON DELETE RESTRICT,
    name       TEXT   NOT NULL,
    repository TEXT   NOT NULL,
    branch     TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (team_id, name)
);

-- secret_key and public_key are in Nix's text form, NAME:base64(key).
CREATE TABLE caches (
    id         TEXT    PRIMARY KEY,
    name       TEXT    NOT NULL UNIQUE,
    public     BOOLEAN NOT NULL DEFAULT FALSE,
    secret_key TEXT    NOT NULL,
    public_key TEXT    NOT NULL,
    created_at BIGINT  NOT NULL
);

CREATE TABLE project_caches (
    project_id TEXT   NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    cache_id   TEXT   NOT NULL REFERENCES caches (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (project_id, cache_id)
);
CREATE INDEX project_caches_by_cache ON project_caches (cache_id);

-- A worker ID belongs to registrations or to one team worker, never both.
-- Each credential row points here with a constant owner column, so the
-- database itself rejects a second kind of owner for one worker ID.
CREATE TABLE worker_ids (
    worker_id TEXT NOT NULL PRIMARY KEY,
    owner     TEXT NOT NULL CHECK (owner IN ('registration', 'team')),
    UNIQUE (worker_id, owner)
);

-- A peer (project, cache or proxy) registered a worker ID. Peers are
-- polymorphic, so their existence is checked in Go, and deleting a
-- project or cache deletes its registrations in the same transaction.
CREATE TABLE worker_registrations (
    peer_kind    TEXT    NOT NULL CHECK (peer_kind IN ('project', 'cache', 'proxy')),
    peer_id      TEXT    NOT NULL,
    worker_id    TEXT    NOT NULL,
    owner        TEXT    NOT NULL DEFAULT 'registration' CHECK (owner = 'registration'),
    token_hash   TEXT    NOT NULL,
    url          TEXT,
    enable_fetch BOOLEAN NOT NULL DEFAULT TRUE,
    enable_eval  BOOLEAN NOT NULL DEFAULT TRUE,
    enable_build BOOLEAN NOT NULL DEFAULT TRUE,
    created_at   BIGINT  NOT NULL,
    PRIMARY KEY (peer_kind, peer_id, worker_id),
    FOREIGN KEY (worker_id, owner) REFERENCES worker_ids (worker_id, owner)
);
CREATE INDEX worker_registrations_by_worker ON worker_registrations (worker_id);

CREATE TABLE team_workers (
    worker_id    TEXT    PRIMARY KEY,
    team_id      TEXT    NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    owner        TEXT    NOT NULL DEFAULT 'team' CHECK (owner = 'team'),
    token_hash   TEXT    NOT NULL,
    url          TEXT,
    enable_fetch BOOLEAN NOT NULL DEFAULT TRUE,
    enable_eval  BOOLEAN NOT NULL DEFAULT TRUE,
    enable_build BOOLEAN NOT NULL DEFAULT TRUE,
    created_at   BIGINT  NOT NULL,
    FOREIGN KEY (worker_id, owner) REFERENCES worker_ids (worker_id, owner)
);
CREATE INDEX team_workers_by_team ON team_workers (team_id);

-- A project lets a team's workers run its jobs.
CREATE TABLE team_grants (
    project_id TEXT   NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    team_id    TEXT   NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (project_id, team_id)
);
CREATE INDEX team_grants_by_team ON team_grants (team_id);

-- Deactivation is by worker ID and outlives the worker's credentials, so
-- re-registering a deactivated worker does not silently reactivate it.
CREATE TABLE worker_deactivations (
    worker_id      TEXT   PRIMARY KEY,
    deactivated_at BIGINT NOT NULL
);
