-- FinishDoneEvaluations runs on every scheduler pass and looks only at
-- building evaluations; without an index it read every evaluation ever
-- recorded. An evaluation changes status a handful of times in its life,
-- so a partial index over the building ones stays small and costs little
-- to maintain, vacuumed or not.
CREATE INDEX evaluations_building ON evaluations (id) WHERE status = 'building';
