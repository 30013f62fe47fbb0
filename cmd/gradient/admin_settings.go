package main

import (
	"fmt"
	"net/http"
	"os"
	"strings"
)

// The admin settings (globalFlags) say which server to talk to and with
// which token. Flags, before or after the command, win over
// GRADIENT_SERVER, GRADIENT_ADMIN_TOKEN and GRADIENT_ADMIN_TOKEN_FILE.

const defaultServer = "http://127.0.0.1:3000"

// tokenFlags name the flags and variables of one service's admin token:
// the server's (--token, --token-file) or the proxy's (--proxy-token,
// --proxy-token-file).
type tokenFlags struct {
	token, file       string
	tokenVar, fileVar string
}

var serverToken = tokenFlags{token: "token", file: "token-file", tokenVar: "GRADIENT_ADMIN_TOKEN", fileVar: "GRADIENT_ADMIN_TOKEN_FILE"}

// missing is the usage error of a command without a token.
func (f tokenFlags) missing() error {
	return fmt.Errorf("no admin token: pass --%s or --%s, or set %s or %s", f.token, f.file, f.tokenVar, f.fileVar)
}

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
func (a *app) adminToken(c *adminCmd) (string, error) { return a.tokenOf(c, serverToken) }

// tokenOf is the token from f's flags, or else from their variables.
func (a *app) tokenOf(c *adminCmd, f tokenFlags) (string, error) {
	token, file := c.cmd.String(f.token), c.cmd.String(f.file)
	tokenFlag, fileFlag := a.givenOnCommandLine(f.token), a.givenOnCommandLine(f.file)
	switch {
	case tokenFlag && fileFlag:
		return "", fmt.Errorf("give --%s or --%s, not both", f.token, f.file)
	case tokenFlag:
		file = ""
	case fileFlag:
		token = ""
	case token != "" && file != "":
		return "", fmt.Errorf("set %s or %s, not both", f.tokenVar, f.fileVar)
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--%s: %w", f.file, err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return "", fmt.Errorf("--%s: %s is empty", f.file, file)
		}
	}
	if token == "" {
		return "", f.missing()
	}
	return token, nil
}
