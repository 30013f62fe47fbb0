-- Forge integration (GitHub, Gitea/Forgejo, GitLab): a project's link to
-- its forge, the webhook deliveries already seen, what evaluations learn
-- from webhooks, and the outbox of commit statuses to post.
--
-- project_forges: the credential (a token, or a GitHub App's private key
-- with app_id set) and the webhook secret are sealed by the server
-- (package sealbox, standard base64) under a key the database never sees.
-- trust decides which pull requests run without an operator's approval:
-- 'approve' (fork PRs wait), 'all', 'none' (no PR runs). status_context is
-- the context of the evaluation's commit status.
CREATE TABLE project_forges (
    project_id            TEXT    PRIMARY KEY REFERENCES projects (id) ON DELETE CASCADE,
    kind                  TEXT    NOT NULL CHECK (kind IN ('github', 'gitea', 'gitlab')),
    api_url               TEXT    NOT NULL,
    repository            TEXT    NOT NULL,
    app_id                BIGINT,
    credential_sealed     TEXT    NOT NULL,
    webhook_secret_sealed TEXT,
    trust                 TEXT    NOT NULL DEFAULT 'approve' CHECK (trust IN ('approve', 'all', 'none')),
    per_build_statuses    BOOLEAN NOT NULL DEFAULT FALSE,
    status_context        TEXT    NOT NULL,
    created_at            BIGINT  NOT NULL,
    updated_at            BIGINT  NOT NULL
);

-- Deliveries seen per project, so a forge's redelivery starts nothing new;
-- pruned by received_at after a week.
CREATE TABLE forge_deliveries (
    project_id  TEXT   NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    delivery_id TEXT   NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (project_id, delivery_id)
);
CREATE INDEX forge_deliveries_by_time ON forge_deliveries (received_at);

-- What started an evaluation ('manual', 'poll', 'push', 'pr'), the pull
-- request and the branch it targets, and approval: NULL when none is
-- needed, 'waiting' (no flake job exists yet), 'approved'.
ALTER TABLE evaluations ADD COLUMN source TEXT NOT NULL DEFAULT 'manual';
ALTER TABLE evaluations ADD COLUMN pr_number BIGINT;
ALTER TABLE evaluations ADD COLUMN target_branch TEXT;
ALTER TABLE evaluations ADD COLUMN approval TEXT;
CREATE INDEX evaluations_by_pr ON evaluations (project_id, pr_number) WHERE pr_number IS NOT NULL;

-- The status outbox: one row per (project, commit, context) holding the
-- newest state to post. Every change bumps version; the poster marks
-- posted_version with the version it posted, so a post of an older
-- version never hides a newer one. eval_created_at keeps an older
-- evaluation of the same commit from overwriting a newer one's state.
-- Rows are written by the triggers below, inside the transaction that
-- changes the evaluation or build.
CREATE TABLE forge_statuses (
    project_id      TEXT    NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    commit_sha      TEXT    NOT NULL,
    context         TEXT    NOT NULL,
    evaluation_id   TEXT    NOT NULL,
    eval_created_at BIGINT  NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('pending', 'success', 'failure', 'error')),
    description     TEXT    NOT NULL,
    version         BIGINT  NOT NULL,
    posted_version  BIGINT  NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT  NOT NULL DEFAULT 0,
    last_error      TEXT,
    updated_at      BIGINT  NOT NULL,
    PRIMARY KEY (project_id, commit_sha, context)
);
CREATE INDEX forge_statuses_due ON forge_statuses (next_attempt_at) WHERE version > posted_version;
CREATE INDEX forge_statuses_by_time ON forge_statuses (updated_at);

-- The outbox rows of an evaluation: pending when it is queued (or waits
-- for approval), pending again once approved, and its end.
CREATE TRIGGER evaluations_forge_queued AFTER INSERT ON evaluations
WHEN EXISTS (SELECT 1 FROM project_forges f WHERE f.project_id = NEW.project_id)
BEGIN
    INSERT INTO forge_statuses (project_id, commit_sha, context, evaluation_id, eval_created_at,
        state, description, version, updated_at)
    SELECT NEW.project_id, NEW.commit_sha, f.status_context, NEW.id, NEW.created_at, 'pending',
        CASE WHEN NEW.approval = 'waiting' THEN 'waiting for approval' ELSE 'queued' END, 1, NEW.created_at
    FROM project_forges f WHERE f.project_id = NEW.project_id
    ON CONFLICT (project_id, commit_sha, context) DO UPDATE SET
        evaluation_id = excluded.evaluation_id, eval_created_at = excluded.eval_created_at,
        state = excluded.state, description = excluded.description,
        version = forge_statuses.version + 1, attempts = 0, next_attempt_at = 0,
        last_error = NULL, updated_at = excluded.updated_at
    WHERE excluded.eval_created_at >= forge_statuses.eval_created_at;
END;

CREATE TRIGGER evaluations_forge_approved AFTER UPDATE OF approval ON evaluations
WHEN OLD.approval = 'waiting' AND NEW.approval = 'approved' AND NEW.status = 'queued'
    AND EXISTS (SELECT 1 FROM project_forges f WHERE f.project_id = NEW.project_id)
BEGIN
    INSERT INTO forge_statuses (project_id, commit_sha, context, evaluation_id, eval_created_at,
        state, description, version, updated_at)
    SELECT NEW.project_id, NEW.commit_sha, f.status_context, NEW.id, NEW.created_at, 'pending',
        'queued', 1, CAST(strftime('%s', 'now') AS INTEGER) * 1000
    FROM project_forges f WHERE f.project_id = NEW.project_id
    ON CONFLICT (project_id, commit_sha, context) DO UPDATE SET
        evaluation_id = excluded.evaluation_id, eval_created_at = excluded.eval_created_at,
        state = excluded.state, description = excluded.description,
        version = forge_statuses.version + 1, attempts = 0, next_attempt_at = 0,
        last_error = NULL, updated_at = excluded.updated_at
    WHERE excluded.eval_created_at >= forge_statuses.eval_created_at;
END;

CREATE TRIGGER evaluations_forge_ended AFTER UPDATE OF status ON evaluations
WHEN NEW.status <> OLD.status AND NEW.status IN ('succeeded', 'failed', 'cancelled')
    AND EXISTS (SELECT 1 FROM project_forges f WHERE f.project_id = NEW.project_id)
BEGIN
    INSERT INTO forge_statuses (project_id, commit_sha, context, evaluation_id, eval_created_at,
        state, description, version, updated_at)
    SELECT NEW.project_id, NEW.commit_sha, f.status_context, NEW.id, NEW.created_at,
        CASE NEW.status WHEN 'succeeded' THEN 'success' WHEN 'failed' THEN 'failure' ELSE 'error' END,
        (SELECT CASE
            WHEN NEW.status = 'cancelled' THEN 'cancelled'
            WHEN NEW.status = 'failed' AND COUNT(CASE WHEN b.status IN ('failed', 'dependency_failed') THEN 1 END) = 0
                THEN 'evaluation failed'
            WHEN COUNT(CASE WHEN b.status IN ('failed', 'dependency_failed') THEN 1 END) > 0
                THEN CAST(COUNT(CASE WHEN b.status = 'succeeded' THEN 1 END) AS TEXT) || ' built, ' ||
                     CAST(COUNT(CASE WHEN b.status IN ('failed', 'dependency_failed') THEN 1 END) AS TEXT) || ' failed'
            ELSE CAST(COUNT(CASE WHEN b.status = 'succeeded' THEN 1 END) AS TEXT) || ' built'
         END FROM builds b WHERE b.evaluation_id = NEW.id),
        1, COALESCE(NEW.finished_at, NEW.created_at)
    FROM project_forges f WHERE f.project_id = NEW.project_id
    ON CONFLICT (project_id, commit_sha, context) DO UPDATE SET
        evaluation_id = excluded.evaluation_id, eval_created_at = excluded.eval_created_at,
        state = excluded.state, description = excluded.description,
        version = forge_statuses.version + 1, attempts = 0, next_attempt_at = 0,
        last_error = NULL, updated_at = excluded.updated_at
    WHERE excluded.eval_created_at >= forge_statuses.eval_created_at;
END;

-- One status per entry-point build, for projects that ask for them.
CREATE TRIGGER builds_forge_ended AFTER UPDATE OF status ON builds
WHEN NEW.attr <> '' AND NEW.status <> OLD.status
    AND NEW.status IN ('succeeded', 'failed', 'dependency_failed', 'cancelled')
    AND EXISTS (SELECT 1 FROM evaluations e JOIN project_forges f ON f.project_id = e.project_id
                WHERE e.id = NEW.evaluation_id AND f.per_build_statuses)
BEGIN
    INSERT INTO forge_statuses (project_id, commit_sha, context, evaluation_id, eval_created_at,
        state, description, version, updated_at)
    SELECT e.project_id, e.commit_sha, f.status_context || '/' || NEW.attr, e.id, e.created_at,
        CASE NEW.status WHEN 'succeeded' THEN 'success' WHEN 'cancelled' THEN 'error' ELSE 'failure' END,
        REPLACE(NEW.status, '_', ' '), 1, COALESCE(NEW.finished_at, e.created_at)
    FROM evaluations e JOIN project_forges f ON f.project_id = e.project_id
    WHERE e.id = NEW.evaluation_id
    ON CONFLICT (project_id, commit_sha, context) DO UPDATE SET
        evaluation_id = excluded.evaluation_id, eval_created_at = excluded.eval_created_at,
        state = excluded.state, description = excluded.description,
        version = forge_statuses.version + 1, attempts = 0, next_attempt_at = 0,
        last_error = NULL, updated_at = excluded.updated_at
    WHERE excluded.eval_created_at >= forge_statuses.eval_created_at;
END;
