package server_test

import (
	"os"
	"testing"

	"gradient.dev/gradient/storage/storagetest"
)

func TestMain(m *testing.M) { os.Exit(storagetest.Main(m)) }
