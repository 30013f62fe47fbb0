CREATE TABLE things (
    id   TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE CHECK (name <> '')
);
CREATE TABLE parts (
    thing_id TEXT NOT NULL REFERENCES things (id) ON DELETE RESTRICT,
    part     TEXT NOT NULL
);
