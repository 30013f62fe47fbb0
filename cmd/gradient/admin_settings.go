package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// The admin settings (globalFlags) say which server to talk to and with
// which token. Flags, before or after the command, win over
// GRADIENT_SERVER, GRADIENT_ADMIN_TOKEN and GRADIENT_ADMIN_TOKEN_FILE.

const defaultServer = "http://127.0.0.1:3000"

// errNoToken is a usage error: the command cannot work without a token.
var errNoToken = errors.New("no admin token: pass --token or --token-file, or set GRADIENT_ADMIN_TOKEN or GRADIENT_ADMIN_TOKEN_FILE")

// adminClient resolves the settings of c's command; on failure it has
// said why.
func (a *app) adminClient(c *adminCmd) (*adminClient, bool) {
	server := c.cmd.String("server")
	if server == "" {
		server = defaultServer
	}
	token, err := a.adminToken(c)
	if err != nil {
		fmt.Fprintf(c.stderr, "gradient %s: %v\n", c.name, err)
		return nil, false
	}
	return &adminClient{base: strings.TrimRight(server, "/"), token: token, http: http.DefaultClient}, true
}

// adminToken is the token from --token or --token-file, or else from
// their variables: a flag on the command line overrides both variables.
func (a *app) adminToken(c *adminCmd) (string, error) {
	token, file := c.cmd.String("token"), c.cmd.String("token-file")
	tokenFlag, fileFlag := a.givenOnCommandLine("token"), a.givenOnCommandLine("token-file")
	switch {
	case tokenFlag && fileFlag:
		return "", errors.New("give --token or --token-file, not both")
	case tokenFlag:
		file = ""
	case fileFlag:
		token = ""
	case token != "" && file != "":
		return "", errors.New("set GRADIENT_ADMIN_TOKEN or GRADIENT_ADMIN_TOKEN_FILE, not both")
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return "", fmt.Errorf("--token-file: %s is empty", file)
		}
	}
	if token == "" {
		return "", errNoToken
	}
	return token, nil
}
