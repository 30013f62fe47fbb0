-- Server-dialed workers: a registration or team worker with a URL also
-- holds its token sealed (AES-256-GCM under a server key the database
-- never sees, standard base64), so the server can present the token when
-- it dials the worker. NULL when the server does not dial, or until the
-- server sealed the token of a new or rotated credential.
ALTER TABLE worker_registrations ADD COLUMN dial_token_sealed TEXT;
ALTER TABLE team_workers ADD COLUMN dial_token_sealed TEXT;
