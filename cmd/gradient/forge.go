package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
)

// gradient project forge …: thin clients of the admin API's forge
// endpoints (server/admin/forges.go). Credentials are read from files,
// never taken on the command line, where other users see them.

// forgeInfo is a project's forge link as the API shows it.
type forgeInfo struct {
	Project          string    `json:"project"`
	Kind             string    `json:"kind"`
	APIURL           string    `json:"api_url"`
	Repository       string    `json:"repository"`
	Credential       string    `json:"credential"`
	AppID            int64     `json:"app_id"`
	Trust            string    `json:"trust"`
	PerBuildStatuses bool      `json:"per_build_statuses"`
	StatusContext    string    `json:"status_context"`
	WebhookSecretSet bool      `json:"webhook_secret_set"`
	WebhookURL       string    `json:"webhook_url"`
	UpdatedAt        time.Time `json:"updated_at"`
}

func (a *app) forgeCommand() *cli.Command {
	return a.adminGroup("forge", "the project's forge (GitHub, Gitea/Forgejo, GitLab): webhooks in, commit statuses out", "", exitUsage,
		a.adminLeaf("set", "link the project to its repository on a forge (replaces the link, keeps the webhook secret)", []string{"PROJECT"}, []cli.Flag{
			&cli.StringFlag{Name: "kind", Usage: "`KIND` of forge: github, gitea (also Forgejo) or gitlab (required)"},
			&cli.StringFlag{Name: "repository", Usage: "the repository on the forge, `OWNER/NAME` (GitLab: GROUP/…/NAME) (required)"},
			&cli.StringFlag{Name: "api-url", Usage: "the forge's API `URL`: GitHub Enterprise https://HOST/api/v3; Gitea, Forgejo and GitLab https://HOST", DefaultText: "https://api.github.com for github"},
			&cli.StringFlag{Name: "forge-token-file", Usage: "`FILE` holding the access token"},
			&cli.IntFlag{Name: "app-id", Usage: "GitHub App `ID` (with --app-key-file, instead of a token)"},
			&cli.StringFlag{Name: "app-key-file", Usage: "`FILE` holding the GitHub App's private key (PEM)"},
			&cli.StringFlag{Name: "trust", Usage: "which pull requests run: approve (forks wait for an approval), all, none", Value: "approve"},
			&cli.BoolFlag{Name: "per-build-statuses", Usage: "also post one status per built attribute"},
		}, forgeSet),
		a.adminLeaf("show", "show the project's forge link (never its secrets) and its webhook URL", []string{"PROJECT"}, nil, forgeShow),
		a.adminLeaf("test", "check that the credentials can read the repository and post statuses", []string{"PROJECT"}, nil, forgeTest),
		a.adminLeaf("remove", "remove the project's forge link and its webhook secret", []string{"PROJECT"}, nil, forgeRemove),
		a.adminLeaf("webhook-secret", "generate the project's webhook secret (replacing one) and print it once with the webhook URL", []string{"PROJECT"}, nil, forgeWebhookSecret),
	)
}

// readSecretFile reads a credential file, trimmed of surrounding space.
func readSecretFile(c *adminCmd, flag string) (string, bool) {
	path := c.cmd.String(flag)
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(c.stderr, "gradient %s: --%s: %v\n", c.name, flag, err)
		return "", false
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		fmt.Fprintf(c.stderr, "gradient %s: --%s: %s is empty\n", c.name, flag, path)
		return "", false
	}
	return s, true
}

func forgeSet(c *adminCmd) int {
	kind, repository := c.cmd.String("kind"), c.cmd.String("repository")
	if kind == "" || repository == "" {
		fmt.Fprintf(c.stderr, "gradient %s: --kind and --repository are required\n", c.name)
		return exitUsage
	}
	body := map[string]any{
		"kind": kind, "repository": repository, "api_url": c.cmd.String("api-url"),
		"trust": c.cmd.String("trust"), "per_build_statuses": c.cmd.Bool("per-build-statuses"),
	}
	tokenFile, appID, keyFile := c.cmd.String("forge-token-file"), c.cmd.Int("app-id"), c.cmd.String("app-key-file")
	switch {
	case tokenFile != "" && (appID != 0 || keyFile != ""):
		fmt.Fprintf(c.stderr, "gradient %s: give --forge-token-file or --app-id with --app-key-file, not both\n", c.name)
		return exitUsage
	case tokenFile != "":
		token, ok := readSecretFile(c, "forge-token-file")
		if !ok {
			return exitUsage
		}
		body["token"] = token
	case appID > 0 && keyFile != "":
		key, ok := readSecretFile(c, "app-key-file")
		if !ok {
			return exitUsage
		}
		body["app_id"], body["app_private_key"] = appID, key+"\n"
	default:
		fmt.Fprintf(c.stderr, "gradient %s: give --forge-token-file, or --app-id with --app-key-file\n", c.name)
		return exitUsage
	}
	var f forgeInfo
	raw, ok := c.call("PUT", "/api/v1/projects/"+seg(c.args[0])+"/forge", body, &f)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Project %s reports to %s %s (%s)\n", f.Project, f.Kind, f.Repository, f.APIURL)
	if !f.WebhookSecretSet {
		fmt.Fprintf(c.stdout, "Next: gradient project forge webhook-secret %s, and add the webhook it prints on the forge.\n", f.Project)
	}
	return exitOK
}

func forgeShow(c *adminCmd) int {
	var f forgeInfo
	raw, ok := c.call("GET", "/api/v1/projects/"+seg(c.args[0])+"/forge", nil, &f)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	credential := f.Credential
	if f.AppID > 0 {
		credential += " " + strconv.FormatInt(f.AppID, 10)
	}
	secret := "not set (gradient project forge webhook-secret " + f.Project + ")"
	if f.WebhookSecretSet {
		secret = "set"
	}
	fields(c.stdout,
		"project", f.Project,
		"kind", f.Kind,
		"api url", f.APIURL,
		"repository", f.Repository,
		"credential", credential,
		"trust", f.Trust,
		"per-build statuses", strconv.FormatBool(f.PerBuildStatuses),
		"status context", f.StatusContext,
		"webhook secret", secret,
		"webhook url", f.WebhookURL,
		"updated", when(f.UpdatedAt))
	return exitOK
}

func forgeTest(c *adminCmd) int {
	var res struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	raw, ok := c.call("POST", "/api/v1/projects/"+seg(c.args[0])+"/forge/test", nil, &res)
	if !ok {
		return exitFail
	}
	if c.json {
		c.printJSON(raw)
	} else if res.OK {
		fmt.Fprintf(c.stdout, "The forge link of %s works: the repository is readable and statuses may be posted\n", c.args[0])
	} else {
		fmt.Fprintf(c.stdout, "The forge link of %s does not work: %s\n", c.args[0], res.Error)
	}
	if !res.OK {
		return exitFail
	}
	return exitOK
}

func forgeRemove(c *adminCmd) int {
	if _, ok := c.call("DELETE", "/api/v1/projects/"+seg(c.args[0])+"/forge", nil, nil); !ok {
		return exitFail
	}
	return c.done("Removed the forge link of project " + c.args[0])
}

func forgeWebhookSecret(c *adminCmd) int {
	var res struct {
		Project    string `json:"project"`
		Secret     string `json:"secret"`
		WebhookURL string `json:"webhook_url"`
	}
	raw, ok := c.call("POST", "/api/v1/projects/"+seg(c.args[0])+"/forge/webhook-secret", nil, &res)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintln(c.stdout, res.Secret)
	fmt.Fprintf(c.stderr, "Add a webhook to the repository on the forge: URL %s, content type application/json, this secret (shown once; GitLab: the secret token); events push, pull requests, comments.\n", res.WebhookURL)
	if !strings.HasPrefix(res.WebhookURL, "http") {
		fmt.Fprintf(c.stderr, "The server has no --external-url: prefix the URL with the address the forge reaches it at.\n")
	}
	return exitOK
}

func evalApprove(c *adminCmd) int {
	var ev evaluationInfo
	raw, ok := c.call("POST", "/api/v1/evaluations/"+seg(c.args[0])+"/approve", nil, &ev)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Evaluation %s is %s\n", ev.ID, ev.Status)
	return exitOK
}
