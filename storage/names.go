package storage

// Team, project and cache names appear in URLs (/cache/{name}/proto) and
// cache names in Nix key names (NAME:base64), so all three are slugs:
// 1-64 characters of [A-Za-z0-9._-], starting with a letter or digit.
// A name must not read as a UUID: the API takes a name or an ID in the
// same place, so such a name would shadow (or be shadowed by) an ID.
const maxNameLen = 64

func validName(what, name string) error {
	if name == "" {
		return invalid("%s name is empty", what)
	}
	if len(name) > maxNameLen {
		return invalid("%s name %q is longer than %d characters", what, name, maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return invalid("%s name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", what, name)
		}
	}
	if _, err := canonicalUUID(what+" name", name); err == nil {
		return invalid("%s name %q reads as a UUID, which would be taken for an ID", what, name)
	}
	return nil
}
