package storage

import "gradient.dev/gradient/storage/sqldb"

// Team, project and cache names appear in URLs (/cache/{name}/proto) and
// cache names in Nix key names (NAME:base64), so all three are sqldb's
// slugs, which never read as a UUID.
func validName(what, name string) error { return sqldb.ValidName(what, name) }
