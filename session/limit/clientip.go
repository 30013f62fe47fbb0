package limit

import (
	"net"
	"net/http"
)

// ClientIP is the address part of the request's remote address, the key
// of the per-address limits.
func ClientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
