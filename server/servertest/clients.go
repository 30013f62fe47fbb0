package servertest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"gradient.dev/gradient/session"
)

// ClientFrom is an HTTP client whose connections leave from the loopback
// address ip (Linux routes all of 127/8 to lo).
func ClientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// StatusOf sends method url with an Authorization value ("" for none).
func StatusOf(t testing.TB, client *http.Client, method, url, auth string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// DialCacheSession opens a read-only cache session on the server whose
// /proto URL is baseWS, with the given Authorization header value (""
// for none).
func DialCacheSession(ctx context.Context, baseWS, cache, authorization string) (*session.WorkerSession, error) {
	h := http.Header{}
	if authorization != "" {
		h.Set("Authorization", authorization)
	}
	quiet := slog.New(slog.DiscardHandler)
	tr, err := session.Dial(ctx, strings.TrimSuffix(baseWS, "/proto")+"/cache/"+cache+"/proto", session.DialOptions{Header: h, Logger: quiet})
	if err != nil {
		return nil, err
	}
	c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
	est, err := session.RunPeer(ctx, c, session.PeerConfig{WorkerID: "reader"})
	if err != nil {
		tr.Close(session.CloseNormal, "")
		return nil, err
	}
	return session.SplitWorker(c, est, session.Options{Logger: quiet}), nil
}
