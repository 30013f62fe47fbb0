package forge

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
)

// parsePrivateKey reads an RSA key in PEM, PKCS#1 or PKCS#8. Its errors
// say what is wrong without quoting the key.
func parsePrivateKey(pemBytes []byte) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, errors.New("forge: the GitHub App private key is not PEM")
	}
	switch block.Type {
	case "RSA PRIVATE KEY":
		k, err := x509.ParsePKCS1PrivateKey(block.Bytes)
		if err != nil {
			return nil, errors.New("forge: the GitHub App private key is not a valid PKCS#1 RSA key")
		}
		return k, nil
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, errors.New("forge: the GitHub App private key is not a valid PKCS#8 key")
		}
		rk, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, errors.New("forge: the GitHub App private key is not an RSA key")
		}
		return rk, nil
	}
	return nil, errors.New("forge: the GitHub App private key's PEM block is neither RSA PRIVATE KEY nor PRIVATE KEY")
}
