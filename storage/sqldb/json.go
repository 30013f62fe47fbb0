package sqldb

import (
	"database/sql"
	"encoding/json"
	"fmt"
)

// JSONText is v as the text of a JSON column.
func JSONText(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// DecodeJSON reads a JSON column into a T; NULL and "" are T's zero value.
// what names the column in the error.
func DecodeJSON[T any](text sql.NullString, what string) (T, error) {
	var v T
	if !text.Valid || text.String == "" {
		return v, nil
	}
	if err := json.Unmarshal([]byte(text.String), &v); err != nil {
		return v, fmt.Errorf("decode %s: %w", what, err)
	}
	return v, nil
}
