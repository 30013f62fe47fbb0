package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// adminSettings say which server to talk to, with which token, and how to
// print. They can come before the command (gradient --server URL team
// list) or after it; flags win over GRADIENT_SERVER,
// GRADIENT_ADMIN_TOKEN and GRADIENT_ADMIN_TOKEN_FILE.
type adminSettings struct {
	server, token, tokenFile string
	json                     bool
}

const defaultServer = "http://127.0.0.1:3000"

// register adds the settings' flags to fs. Registering on several flag
// sets with the same fields lets later flags override earlier ones.
func (s *adminSettings) register(fs *flag.FlagSet) {
	fs.StringVar(&s.server, "server", s.server, "server URL (env GRADIENT_SERVER, default "+defaultServer+")")
	fs.StringVar(&s.token, "token", s.token, "admin token (env GRADIENT_ADMIN_TOKEN)")
	fs.StringVar(&s.tokenFile, "token-file", s.tokenFile, "file holding the admin token (env GRADIENT_ADMIN_TOKEN_FILE)")
	fs.BoolVar(&s.json, "json", s.json, "print JSON instead of text")
}

// errNoToken is a usage error: the command cannot work without a token.
var errNoToken = errors.New("no admin token: pass --token or --token-file, or set GRADIENT_ADMIN_TOKEN or GRADIENT_ADMIN_TOKEN_FILE")

// client resolves the settings against the environment.
func (s *adminSettings) client(getenv func(string) string) (*adminClient, error) {
	server := s.server
	if server == "" {
		server = getenv("GRADIENT_SERVER")
	}
	if server == "" {
		server = defaultServer
	}
	token, err := s.resolveToken(getenv)
	if err != nil {
		return nil, err
	}
	return &adminClient{base: strings.TrimRight(server, "/"), token: token, http: http.DefaultClient}, nil
}

func (s *adminSettings) resolveToken(getenv func(string) string) (string, error) {
	token, file := s.token, s.tokenFile
	if token != "" && file != "" {
		return "", errors.New("give --token or --token-file, not both")
	}
	if token == "" && file == "" {
		token, file = getenv("GRADIENT_ADMIN_TOKEN"), getenv("GRADIENT_ADMIN_TOKEN_FILE")
		if token != "" && file != "" {
			return "", errors.New("set GRADIENT_ADMIN_TOKEN or GRADIENT_ADMIN_TOKEN_FILE, not both")
		}
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("admin token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return "", fmt.Errorf("admin token file %s is empty", file)
		}
	}
	if token == "" {
		return "", errNoToken
	}
	return token, nil
}

// parseInterleaved parses flags that may come before, between or after
// positional arguments (gradient project create ops/web --repository URL),
// which flag.Parse alone stops at. Everything after "--" is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		consumed := args[:len(args)-len(rest)]
		if len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
