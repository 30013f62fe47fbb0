// Package dialguard keeps a process from dialing link-local addresses,
// where cloud metadata services answer (169.254.169.254 serves a VM's
// credentials and user data, on Hetzner, AWS, GCP and Azure alike), on
// behalf of a URL someone else chose. It checks twice: a URL's literal
// address when the URL is set (CheckHost), and every address a name
// resolves to when it is dialed (Control, for net.Dialer), so a DNS
// name that points at such an address is refused too.
//
// Loopback stays allowed: tests and single-host setups dial 127.0.0.1.
package dialguard

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
)

// ErrRefused is what CheckHost and Control return (wrapped) for a
// refused address.
var ErrRefused = errors.New("link-local and cloud metadata addresses are refused")

var refusedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"), // IPv4 link-local, the metadata services
	netip.MustParsePrefix("fe80::/10"),      // IPv6 link-local
}

// refusedAddrs are metadata services outside the link-local ranges.
var refusedAddrs = []netip.Addr{
	netip.MustParseAddr("fd00:ec2::254"),   // AWS, IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	netip.MustParseAddr("192.0.0.192"),     // Oracle Cloud
}

// nat64 is the well-known NAT64 prefix: its last 32 bits are an IPv4
// address a NAT64 gateway dials.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// Refused reports whether ip is link-local or a cloud metadata address
// (also as IPv4-mapped or NAT64 IPv6).
func Refused(ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	if nat64.Contains(ip) {
		b := ip.As16()
		ip = netip.AddrFrom4([4]byte(b[12:]))
	}
	for _, p := range refusedPrefixes {
		if p.Contains(ip) {
			return true
		}
	}
	for _, a := range refusedAddrs {
		if ip == a {
			return true
		}
	}
	return false
}

// CheckHost refuses a host (a name, an address, with or without a port
// or IPv6 brackets) that is a refused literal address. Names pass: they
// are checked when dialed.
func CheckHost(host string) error {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return nil // a name, or a form only a resolver reads: Control checks what it dials
	}
	if Refused(ip) {
		return fmt.Errorf("%s: %w", ip.WithZone(""), ErrRefused)
	}
	return nil
}

// CheckURL is CheckHost of a URL's host.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return nil // the caller's own checks report a malformed URL
	}
	return CheckHost(u.Host)
}

// Control is a net.Dialer Control function refusing a connection to a
// refused address, after name resolution and before the connect.
func Control(_, address string, _ syscall.RawConn) error {
	// net.OpError around it already names the network and address.
	return CheckHost(address)
}
