-- Errors an evaluation reported (attributes that failed to evaluate,
-- targets that matched nothing): the evaluation ends failed when its
-- builds are done, even if every build succeeded.
ALTER TABLE evaluations ADD COLUMN eval_errors TEXT;
