-- The durable job queue: evaluations of a project's commit, the builds
-- their derivations need, the jobs the server dispatches to workers, the
-- assignments of jobs to workers, and the jobs' logs.
--
-- JSON columns hold JSON text (arrays of strings or objects). job_logs.data
-- is BYTEA: PostgreSQL's byte string; SQLite gives that declared type
-- NUMERIC affinity, which stores BLOB values unchanged.

CREATE TABLE evaluations (
    id             TEXT    PRIMARY KEY,
    project_id     TEXT    NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    repository_url TEXT    NOT NULL,
    commit_sha     TEXT    NOT NULL,
    wildcards      TEXT    NOT NULL,
    status         TEXT    NOT NULL CHECK (status IN
        ('queued', 'fetching', 'evaluating', 'building', 'succeeded', 'failed', 'cancelled')),
    flake_source   TEXT,
    error          TEXT,
    attempts       INTEGER NOT NULL DEFAULT 0,
    created_at     BIGINT  NOT NULL,
    started_at     BIGINT,
    finished_at    BIGINT
);
CREATE INDEX evaluations_by_project ON evaluations (project_id, created_at);
CREATE INDEX evaluations_by_created ON evaluations (created_at);

-- One build per derivation of an evaluation. attr is the entry-point
-- attribute path, '' for a dependency. outputs: [{"name","path"}];
-- output_info: the outputs the worker reported,
-- [{"name","store_path","nar_size","nar_hash"}].
CREATE TABLE builds (
    id                 TEXT    PRIMARY KEY,
    evaluation_id      TEXT    NOT NULL REFERENCES evaluations (id) ON DELETE CASCADE,
    drv_path           TEXT    NOT NULL,
    attr               TEXT    NOT NULL DEFAULT '',
    architecture       TEXT    NOT NULL,
    required_features  TEXT    NOT NULL,
    outputs            TEXT    NOT NULL,
    timeout_secs       BIGINT,
    max_silent_secs    BIGINT,
    is_fixed_output    BOOLEAN NOT NULL DEFAULT FALSE,
    prefer_local_build BOOLEAN NOT NULL DEFAULT FALSE,
    status             TEXT    NOT NULL CHECK (status IN
        ('waiting', 'queued', 'building', 'succeeded', 'failed', 'dependency_failed', 'cancelled')),
    failure_kind       TEXT,
    error              TEXT,
    attempts           INTEGER NOT NULL DEFAULT 0,
    worker_id          TEXT,
    output_info        TEXT,
    created_at         BIGINT  NOT NULL,
    started_at         BIGINT,
    finished_at        BIGINT,
    UNIQUE (evaluation_id, drv_path)
);
CREATE INDEX builds_by_status ON builds (evaluation_id, status);

-- Dependencies by drv path, so batches of discovered derivations may come
-- in any order. A dependency that is not a build of the evaluation counts
-- as available.
CREATE TABLE build_edges (
    evaluation_id       TEXT NOT NULL REFERENCES evaluations (id) ON DELETE CASCADE,
    drv_path            TEXT NOT NULL,
    dependency_drv_path TEXT NOT NULL,
    PRIMARY KEY (evaluation_id, drv_path, dependency_drv_path)
);
CREATE INDEX build_edges_by_dependency ON build_edges (evaluation_id, dependency_drv_path);

-- One flake job per evaluation, one build job per build.
CREATE TABLE jobs (
    id            TEXT    PRIMARY KEY,
    kind          TEXT    NOT NULL CHECK (kind IN ('flake', 'build')),
    evaluation_id TEXT    NOT NULL REFERENCES evaluations (id) ON DELETE CASCADE,
    build_id      TEXT    REFERENCES builds (id) ON DELETE CASCADE,
    project_id    TEXT    NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    status        TEXT    NOT NULL CHECK (status IN ('pending', 'assigned', 'done', 'failed', 'cancelled')),
    ready_at      BIGINT  NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    created_at    BIGINT  NOT NULL,
    CHECK ((kind = 'build') = (build_id IS NOT NULL))
);
CREATE INDEX jobs_pending ON jobs (ready_at, id) WHERE status = 'pending';
CREATE INDEX jobs_by_evaluation ON jobs (evaluation_id, status);
CREATE UNIQUE INDEX jobs_by_build ON jobs (build_id) WHERE build_id IS NOT NULL;

-- A job handed to a worker. At most one open assignment per job: the
-- partial unique index arbitrates concurrent claims.
CREATE TABLE job_assignments (
    id        TEXT   PRIMARY KEY,
    job_id    TEXT   NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    worker_id TEXT   NOT NULL,
    opened_at BIGINT NOT NULL,
    closed_at BIGINT,
    outcome   TEXT
);
CREATE UNIQUE INDEX job_assignments_open ON job_assignments (job_id) WHERE closed_at IS NULL;
CREATE INDEX job_assignments_open_by_worker ON job_assignments (worker_id) WHERE closed_at IS NULL;
CREATE INDEX job_assignments_by_job ON job_assignments (job_id);

CREATE TABLE job_logs (
    job_id     TEXT   NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq        BIGINT NOT NULL,
    data       BYTEA  NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
