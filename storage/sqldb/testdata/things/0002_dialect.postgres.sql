CREATE TABLE dialect (engine TEXT NOT NULL);
INSERT INTO dialect (engine) VALUES ('postgres');
