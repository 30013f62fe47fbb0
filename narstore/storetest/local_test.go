package storetest_test

import (
	"os"
	"path/filepath"
	"testing"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/narstore/storetest"
)

func TestLocal(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		dir := t.TempDir()
		s, err := narstore.OpenLocal(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Fixture{
			Store: s,
			Keys: func(t *testing.T) []string {
				keys, err := s.Keys()
				if err != nil {
					t.Fatal(err)
				}
				return keys
			},
			Leftovers: func(t *testing.T) []string {
				left, _ := filepath.Glob(filepath.Join(dir, "nars", ".put-*"))
				entries, _ := os.ReadDir(dir)
				for _, e := range entries {
					if e.Name() != "nars" {
						left = append(left, e.Name())
					}
				}
				return left
			},
		}
	})
}
