package servicecli

import (
	"errors"
	"time"

	"github.com/urfave/cli/v3"

	"gradient.dev/gradient/internal/httpguard"
)

// HTTPTimeoutFlags are the flags of an HTTP listener's timeouts
// (httpguard.Timeouts), the same in every binary; vars names a flag's
// environment variables.
func HTTPTimeoutFlags(t *httpguard.Timeouts, vars func(flag string) cli.ValueSourceChain) []cli.Flag {
	positive := func(d time.Duration) error {
		if d <= 0 {
			return errors.New("must be more than 0")
		}
		return nil
	}
	flag := func(name string, dst *time.Duration, def time.Duration, usage string) cli.Flag {
		return &SecondsFlag{Name: name, Value: def, Destination: dst, Sources: vars(name), Validator: positive, Usage: usage}
	}
	return []cli.Flag{
		flag("http-header-timeout", &t.Header, httpguard.DefaultHeaderTimeout,
			"seconds a client may take to send a request's headers; a connection with half-sent headers is closed"),
		flag("http-body-timeout", &t.Body, httpguard.DefaultBodyTimeout,
			"seconds a request body may stall (renewed while it moves; not for WebSocket sessions, which keep their protocol timeouts)"),
		flag("http-idle-timeout", &t.Idle, httpguard.DefaultIdleTimeout,
			"seconds a keep-alive connection may wait for its next request before it is closed"),
	}
}
