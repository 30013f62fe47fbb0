package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v3"
)

// Scoped API tokens, public projects and the restart of failed builds:
// thin clients of server/admin/access.go.

func (a *app) tokenCommand() *cli.Command {
	return a.adminGroup("token", "scoped API tokens: read (GET only) or admin, for the API and the dashboard's login", "", exitUsage,
		a.adminLeaf("create", "make a token and print it, once", []string{"NAME"}, []cli.Flag{
			&cli.StringFlag{Name: "scope", Usage: "what the token may do: read (GET only) or admin", Value: "read"},
		}, tokenCreate),
		a.adminLeaf("list", "list the tokens (never their secrets)", nil, nil, tokenList),
		a.adminLeaf("revoke", "revoke a token and end the dashboard sessions it opened", []string{"TOKEN_ID"}, nil, tokenRevoke),
	)
}

type tokenInfo struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Scope     string    `json:"scope"`
	CreatedAt time.Time `json:"created_at"`
	Token     string    `json:"token"`
}

func tokenCreate(c *adminCmd) int {
	var t tokenInfo
	raw, ok := c.call("POST", "/api/v1/tokens", map[string]string{"name": c.args[0], "scope": c.cmd.String("scope")}, &t)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Token %s (%s, id %s); it is shown only now:\n%s\n", t.Name, t.Scope, t.ID, t.Token)
	return exitOK
}

func tokenList(c *adminCmd) int {
	var tokens []tokenInfo
	raw, ok := c.call("GET", "/api/v1/tokens", nil, &tokens)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(tokens))
	for _, t := range tokens {
		rows = append(rows, []string{t.Name, t.Scope, t.ID, when(t.CreatedAt)})
	}
	table(c.stdout, []string{"NAME", "SCOPE", "ID", "CREATED"}, rows)
	return exitOK
}

func tokenRevoke(c *adminCmd) int {
	if _, ok := c.call("DELETE", "/api/v1/tokens/"+seg(c.args[0]), nil, nil); !ok {
		return exitFail
	}
	return c.done("Token " + c.args[0] + " revoked")
}

// projectPublic makes a project's evaluations, builds and logs readable
// without credentials on the dashboard, or (--off) private again.
func projectPublic(c *adminCmd) int {
	method, what := "PUT", "public: its evaluations, builds and logs are readable without logging in"
	if c.cmd.Bool("off") {
		method, what = "DELETE", "private"
	}
	var v struct {
		ProjectID string `json:"project_id"`
		Public    bool   `json:"public"`
	}
	raw, ok := c.call(method, "/api/v1/projects/"+seg(c.args[0])+"/public", nil, &v)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Project %s is %s\n", c.args[0], what)
	return exitOK
}

func evalRestartFailed(c *adminCmd) int {
	var v struct {
		Evaluation evaluationInfo `json:"evaluation"`
		Restarted  int            `json:"restarted"`
	}
	raw, ok := c.call("POST", "/api/v1/evaluations/"+seg(c.args[0])+"/restart-failed", nil, &v)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Restarted %d failed builds; evaluation %s is %s\n", v.Restarted, v.Evaluation.ID, v.Evaluation.Status)
	return exitOK
}
