package dialguard

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestRefused(t *testing.T) {
	for addr, want := range map[string]bool{
		"169.254.169.254":        true,
		"169.254.0.1":            true,
		"fe80::1":                true,
		"fe80::1%lo":             true,
		"febf::1":                true,
		"fd00:ec2::254":          true,
		"::ffff:169.254.169.254": true,
		"64:ff9b::a9fe:a9fe":     true, // NAT64 of 169.254.169.254
		"100.100.100.200":        true,
		"192.0.0.192":            true,
		"127.0.0.1":              false, // loopback stays allowed
		"::1":                    false,
		"10.0.0.1":               false,
		"169.253.255.255":        false,
		"fec0::1":                false,
		"fd00:ec2::253":          false,
		"203.0.113.7":            false,
	} {
		if got := Refused(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Refused(%s) = %v, want %v", addr, got, want)
		}
	}
}

func TestCheckURL(t *testing.T) {
	for url, refused := range map[string]bool{
		"ws://169.254.169.254/proto":       true,
		"wss://169.254.169.254:443/proto":  true,
		"ws://[fe80::1%25eth0]:3000/proto": true,
		"ws://[fd00:ec2::254]/proto":       true,
		"ws://[::ffff:169.254.169.254]/":   true,
		"ws://127.0.0.1:3000/proto":        false,
		"wss://ci.example.com/proto":       false, // a name: checked when dialed
		"wss://metadata.google.internal/":  false,
		"ws://[::1]:3000/proto":            false,
		"not a url at all ::":              false,
	} {
		err := CheckURL(url)
		if (err != nil) != refused || (err != nil && !errors.Is(err, ErrRefused)) {
			t.Errorf("CheckURL(%q) = %v, want refused %v", url, err, refused)
		}
	}
}

// A name that resolves to the metadata address is refused when dialed,
// after resolution and before any connect; loopback still connects.
func TestControlRefusesWhatANameResolvesTo(t *testing.T) {
	dns := fakeDNS(t, netip.MustParseAddr("169.254.169.254"))
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", dns)
	}}
	d := &net.Dialer{Resolver: resolver, Control: Control, Timeout: 30 * time.Second}
	_, err := d.DialContext(t.Context(), "tcp4", "metadata.tenant.example:80")
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("dialing a name that resolves to 169.254.169.254: %v, want the refusal", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := (&net.Dialer{Control: Control}).Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dialing loopback: %v", err)
	}
	c.Close()
	if _, err := (&net.Dialer{Control: Control}).Dial("tcp", "169.254.169.254:80"); !errors.Is(err, ErrRefused) {
		t.Fatalf("dialing 169.254.169.254: %v, want the refusal", err)
	}
}

// fakeDNS is a DNS server on loopback UDP that answers every A query
// with addr (and AAAA queries with no record), as a tenant's hostile
// DNS might.
func fakeDNS(t *testing.T, addr netip.Addr) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			if n < 12 {
				continue
			}
			// The question ends after its name (labels up to a zero
			// byte), type and class.
			end := 12
			for end < n && q[end] != 0 {
				end += int(q[end]) + 1
			}
			end += 5
			if end > n {
				continue
			}
			qtype := binary.BigEndian.Uint16(q[end-4:])
			resp := append([]byte{}, q[:2]...)          // ID
			resp = append(resp, 0x81, 0x80)             // response, recursion available, no error
			resp = append(resp, 0, 1, 0, 0, 0, 0, 0, 0) // one question, answers set below
			resp = append(resp, q[12:end]...)
			if qtype == 1 {
				resp[7] = 1
				a := addr.As4()
				resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
				resp = append(resp, a[:]...)
			}
			pc.WriteTo(resp, from)
		}
	}()
	return pc.LocalAddr().String()
}
