package storage

import (
	"strconv"
	"strings"
)

// inList appends values to args as query parameters and returns the
// placeholders naming them ("$3, $4, $5"), for an IN (...) list. Callers
// keep a list to a few hundred values: both engines cap the parameters of
// one statement.
func inList(args []any, values []string) ([]any, string) {
	var b strings.Builder
	for i, v := range values {
		if i > 0 {
			b.WriteString(", ")
		}
		args = append(args, v)
		b.WriteString("$" + strconv.Itoa(len(args)))
	}
	return args, b.String()
}

// inListMax is the most values an IN list of one query carries.
const inListMax = 500
