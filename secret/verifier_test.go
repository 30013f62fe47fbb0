package secret

import "testing"

func TestVerifierMatchesLikeVerify(t *testing.T) {
	token, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := Generate()
	stored, err := Hash(token)
	if err != nil {
		t.Fatal(err)
	}
	v := NewVerifier(2)
	for i := range 3 { // the second and third come from the memo
		if !v.Verify(stored, token) {
			t.Fatalf("round %d: the right token did not verify", i)
		}
		if v.Verify(stored, other) {
			t.Fatalf("round %d: a wrong token verified", i)
		}
	}
	// A remembered pair is bound to its hash: the token against another
	// token's hash never matches.
	otherStored, _ := Hash(other)
	if v.Verify(otherStored, token) {
		t.Fatal("a token verified against another token's hash")
	}
	if len(v.matched) != 1 {
		t.Fatalf("memo holds %d pairs, want 1 (failures are never kept)", len(v.matched))
	}
}
