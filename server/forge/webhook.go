package forge

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
)

// MaxPayload bounds a delivery's body: an endpoint reads at most
// MaxPayload+1 bytes and refuses a body that reaches the extra byte.
// GitHub caps payloads at 25 MB but a push of the size CI cares about
// is a few kilobytes; commits lists are what grow, and they are ignored.
const MaxPayload = 1 << 20

// ErrSignature is Verify's refusal: the delivery did not come from a
// forge holding the project's webhook secret.
var ErrSignature = errors.New("forge: bad or missing webhook signature")

// Verify checks that a delivery was signed with secret, in constant time:
//   - GitHub: X-Hub-Signature-256 "sha256=<hex HMAC-SHA256 of the body>";
//   - Gitea and Forgejo: X-Gitea-Signature, X-Forgejo-Signature (hex
//     HMAC-SHA256) and X-Hub-Signature-256 (which Gitea sends too); every
//     one present must match and at least one must be;
//   - GitLab: X-Gitlab-Token equals the secret.
//
// An empty secret verifies nothing. The only error is ErrSignature.
func Verify(k Kind, secret []byte, h http.Header, body []byte) error {
	if len(secret) == 0 {
		return ErrSignature
	}
	switch k {
	case GitHub:
		return verifyHubSignature(secret, h.Values("X-Hub-Signature-256"), body)
	case Gitea:
		present := 0
		for _, name := range []string{"X-Gitea-Signature", "X-Forgejo-Signature"} {
			vs := h.Values(name)
			if len(vs) == 0 {
				continue
			}
			present++
			if len(vs) != 1 || !hmacMatches(secret, vs[0], body) {
				return ErrSignature
			}
		}
		if vs := h.Values("X-Hub-Signature-256"); len(vs) > 0 {
			present++
			if err := verifyHubSignature(secret, vs, body); err != nil {
				return err
			}
		}
		if present == 0 {
			return ErrSignature
		}
		return nil
	case GitLab:
		vs := h.Values("X-Gitlab-Token")
		if len(vs) != 1 {
			return ErrSignature
		}
		// Hashing both sides first makes the comparison's time independent
		// of the secret's length too.
		got, want := sha256.Sum256([]byte(vs[0])), sha256.Sum256(secret)
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			return ErrSignature
		}
		return nil
	}
	return ErrSignature
}

func verifyHubSignature(secret []byte, vs []string, body []byte) error {
	if len(vs) != 1 {
		return ErrSignature
	}
	hexSig, ok := strings.CutPrefix(vs[0], "sha256=")
	if !ok || !hmacMatches(secret, hexSig, body) {
		return ErrSignature
	}
	return nil
}

// hmacMatches compares a hex HMAC-SHA256 with the body's, in constant time.
func hmacMatches(secret []byte, hexSig string, body []byte) bool {
	got, err := hex.DecodeString(strings.TrimSpace(hexSig))
	if err != nil || len(got) != sha256.Size {
		return false
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return hmac.Equal(got, mac.Sum(nil))
}

// Sign is the hex HMAC-SHA256 of body under secret, as GitHub, Gitea and
// Forgejo sign deliveries (GitHub prefixes it with "sha256=").
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// maxDeliveryID bounds the delivery ID kept for deduplication; forges
// send UUIDs (36 bytes).
const maxDeliveryID = 128

// DeliveryID is the forge's ID of a delivery, the same on every retry of
// it: X-GitHub-Delivery, X-Gitea-Delivery or X-Forgejo-Delivery,
// X-Gitlab-Event-UUID (GitLab also sends X-Gitlab-Webhook-UUID, which is
// the hook's, not the delivery's). "" when absent or not printable ASCII
// of at most 128 bytes; the caller then uses the SHA-256 of the body.
func DeliveryID(k Kind, h http.Header) string {
	var names []string
	switch k {
	case GitHub:
		names = []string{"X-GitHub-Delivery"}
	case Gitea:
		names = []string{"X-Gitea-Delivery", "X-Forgejo-Delivery"}
	case GitLab:
		names = []string{"X-Gitlab-Event-UUID"}
	}
	for _, n := range names {
		if id := h.Get(n); id != "" && printableID(id) {
			return id
		}
	}
	return ""
}

func printableID(s string) bool {
	if len(s) > maxDeliveryID {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// PullRef is the ref a pull or merge request's head is fetched from:
// refs/pull/N/head on GitHub and Gitea, refs/merge-requests/N/head on
// GitLab.
func PullRef(k Kind, number int) string {
	if k == GitLab {
		return "refs/merge-requests/" + strconv.Itoa(number) + "/head"
	}
	return "refs/pull/" + strconv.Itoa(number) + "/head"
}
