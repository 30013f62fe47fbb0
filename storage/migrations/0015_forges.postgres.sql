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

-- forge_status_put writes one outbox row (see forge_statuses).
CREATE FUNCTION forge_status_put(p TEXT, c TEXT, ctx TEXT, ev TEXT, ev_created BIGINT,
    st TEXT, descr TEXT, at BIGINT) RETURNS void LANGUAGE sql AS $$
    INSERT INTO forge_statuses (project_id, commit_sha, context, evaluation_id, eval_created_at,
        state, description, version, updated_at)
    VALUES (p, c, ctx, ev, ev_created, st, descr, 1, at)
    ON CONFLICT (project_id, commit_sha, context) DO UPDATE SET
        evaluation_id = excluded.evaluation_id, eval_created_at = excluded.eval_created_at,
        state = excluded.state, description = excluded.description,
        version = forge_statuses.version + 1, attempts = 0, next_attempt_at = 0,
        last_error = NULL, updated_at = excluded.updated_at
    WHERE excluded.eval_created_at >= forge_statuses.eval_created_at
$$;

-- The outbox rows of an evaluation: pending when it is queued (or waits
-- for approval), pending again once approved, and its end.
CREATE FUNCTION evaluations_forge_status() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ctx TEXT; st TEXT; descr TEXT; ok BIGINT; bad BIGINT;
BEGIN
    SELECT status_context INTO ctx FROM project_forges WHERE project_id = NEW.project_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        st := 'pending';
        descr := CASE WHEN NEW.approval = 'waiting' THEN 'waiting for approval' ELSE 'queued' END;
    ELSIF OLD.approval = 'waiting' AND NEW.approval = 'approved' AND NEW.status = 'queued' THEN
        st := 'pending';
        descr := 'queued';
    ELSIF NEW.status IS DISTINCT FROM OLD.status AND NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
        SELECT COUNT(*) FILTER (WHERE status = 'succeeded'),
               COUNT(*) FILTER (WHERE status IN ('failed', 'dependency_failed'))
          INTO ok, bad FROM builds WHERE evaluation_id = NEW.id;
        st := CASE NEW.status WHEN 'succeeded' THEN 'success' WHEN 'failed' THEN 'failure' ELSE 'error' END;
        descr := CASE
            WHEN NEW.status = 'cancelled' THEN 'cancelled'
            WHEN NEW.status = 'failed' AND bad = 0 THEN 'evaluation failed'
            WHEN bad > 0 THEN ok::text || ' built, ' || bad::text || ' failed'
            ELSE ok::text || ' built' END;
    ELSE
        RETURN NULL;
    END IF;
    PERFORM forge_status_put(NEW.project_id, NEW.commit_sha, ctx, NEW.id, NEW.created_at, st, descr,
        COALESCE(NEW.finished_at, (extract(epoch FROM clock_timestamp()) * 1000)::bigint));
    RETURN NULL;
END $$;
CREATE TRIGGER evaluations_forge_queued AFTER INSERT ON evaluations
    FOR EACH ROW EXECUTE FUNCTION evaluations_forge_status();
CREATE TRIGGER evaluations_forge_changed AFTER UPDATE OF status, approval ON evaluations
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.approval IS DISTINCT FROM NEW.approval)
    EXECUTE FUNCTION evaluations_forge_status();

-- One status per entry-point build, for projects that ask for them.
CREATE FUNCTION builds_forge_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM forge_status_put(e.project_id, e.commit_sha, f.status_context || '/' || NEW.attr, e.id, e.created_at,
        CASE NEW.status WHEN 'succeeded' THEN 'success' WHEN 'cancelled' THEN 'error' ELSE 'failure' END,
        replace(NEW.status, '_', ' '), COALESCE(NEW.finished_at, e.created_at))
      FROM evaluations e JOIN project_forges f ON f.project_id = e.project_id
     WHERE e.id = NEW.evaluation_id AND f.per_build_statuses;
    RETURN NULL;
END $$;
CREATE TRIGGER builds_forge_ended AFTER UPDATE OF status ON builds
    FOR EACH ROW WHEN (NEW.attr <> '' AND NEW.status IS DISTINCT FROM OLD.status
        AND NEW.status IN ('succeeded', 'failed', 'dependency_failed', 'cancelled'))
    EXECUTE FUNCTION builds_forge_status();
