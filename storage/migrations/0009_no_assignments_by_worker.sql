-- The scheduler releases a lost session's assignments one by one (a
-- worker that reconnected holds new ones), so nothing looks up open
-- assignments by worker, and every claim paid for this index.
DROP INDEX job_assignments_open_by_worker;
