-- Which derivations were ever built: the server answers
-- QueryKnownDerivations from it, so evaluations skip built subtrees.
CREATE INDEX builds_succeeded_drv ON builds (drv_path) WHERE status = 'succeeded';
