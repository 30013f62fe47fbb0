package storage

// Team, project and cache names appear in URLs (/cache/{name}/proto) and
// cache names in Nix key names (NAME:base64), so all three are slugs:
// 1-64 characters of [A-Za-z0-9._-], starting with a letter or digit.
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
	return nil
}
