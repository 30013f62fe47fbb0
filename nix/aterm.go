package nix

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// A .drv file is one ATerm term, as Nix writes it (derivations.cc):
//
//	Derive([outputs],[inputDrvs],[inputSrcs],"platform","builder",[args],[env])
//
// outputs are ("name","path","hashAlgo","hash") tuples, inputDrvs
// ("drv",["output",…]) pairs, env ("key","value") pairs; strings are
// quoted with \" \\ \n \r \t escaped. ParseDerivation accepts exactly that
// grammar and nothing looser: a .drv comes from the store of a machine
// this worker does not control.

// maxDerivationBytes bounds a .drv read into memory; Nix itself has no
// limit, but real ones are kilobytes (nixpkgs' largest are a few MiB).
const maxDerivationBytes = 64 << 20

// ErrDerivationSyntax is wrapped by every ParseDerivation error.
var ErrDerivationSyntax = errors.New("malformed derivation")

// ParseDerivation parses the ATerm text of the .drv at drvPath (used for
// error messages and the derivation's name; it may be empty).
func ParseDerivation(drvPath string, text []byte) (*Derivation, error) {
	p := &atermParser{s: text}
	d, err := p.derivation()
	if err != nil {
		return nil, fmt.Errorf("%w %s: at byte %d: %w", ErrDerivationSyntax, drvPath, p.i, err)
	}
	d.Path = drvPath
	d.Name = d.Env["name"]
	if base := baseName(drvPath); len(base) > 33 && strings.HasSuffix(base, ".drv") {
		d.Name = strings.TrimSuffix(base[33:], ".drv")
	}
	return d, nil
}

type atermParser struct {
	s []byte
	i int
}

func (p *atermParser) derivation() (*Derivation, error) {
	if err := p.literal("Derive("); err != nil {
		if bytes.HasPrefix(p.s, []byte("DrvWithVersion(")) {
			return nil, errors.New("versioned derivations (experimental dynamic derivations) are not supported")
		}
		return nil, err
	}
	d := &Derivation{Outputs: map[string]DerivationOutput{}, InputDrvs: map[string][]string{}, Env: map[string]string{}}
	err := p.list(func() error {
		return p.tuple(func() error {
			name, err := p.str()
			if err != nil {
				return err
			}
			var out DerivationOutput
			if out.Path, err = p.next(); err != nil {
				return err
			}
			if out.HashAlgo, err = p.next(); err != nil {
				return err
			}
			if out.Hash, err = p.next(); err != nil {
				return err
			}
			if err := checkOutput(name, &out); err != nil {
				return err
			}
			if _, dup := d.Outputs[name]; dup {
				return fmt.Errorf("output %q twice", name)
			}
			d.Outputs[name] = out
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("outputs: %w", err)
	}
	if len(d.Outputs) == 0 {
		return nil, errors.New("no outputs")
	}
	if err := p.literal(","); err != nil {
		return nil, err
	}
	err = p.list(func() error {
		return p.tuple(func() error {
			drv, err := p.str()
			if err != nil {
				return err
			}
			if err := checkStorePath(drv); err != nil || !strings.HasSuffix(drv, ".drv") {
				return fmt.Errorf("input derivation %q is not a store path of a .drv", drv)
			}
			if _, dup := d.InputDrvs[drv]; dup {
				return fmt.Errorf("input derivation %s twice", drv)
			}
			if err := p.literal(","); err != nil {
				return err
			}
			outs, err := p.strings()
			if err != nil {
				return err
			}
			if len(outs) == 0 {
				return fmt.Errorf("input derivation %s names no outputs", drv)
			}
			d.InputDrvs[drv] = outs
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("input derivations: %w", err)
	}
	if err := p.literal(","); err != nil {
		return nil, err
	}
	if d.InputSrcs, err = p.strings(); err != nil {
		return nil, fmt.Errorf("input sources: %w", err)
	}
	for _, src := range d.InputSrcs {
		if err := checkStorePath(src); err != nil {
			return nil, fmt.Errorf("input source %q: %w", src, err)
		}
	}
	if d.System, err = p.next(); err != nil {
		return nil, fmt.Errorf("platform: %w", err)
	}
	if d.Builder, err = p.next(); err != nil {
		return nil, fmt.Errorf("builder: %w", err)
	}
	if err := p.literal(","); err != nil {
		return nil, err
	}
	if d.Args, err = p.strings(); err != nil {
		return nil, fmt.Errorf("arguments: %w", err)
	}
	if err := p.literal(","); err != nil {
		return nil, err
	}
	err = p.list(func() error {
		return p.tuple(func() error {
			key, err := p.str()
			if err != nil {
				return err
			}
			value, err := p.next()
			if err != nil {
				return err
			}
			if _, dup := d.Env[key]; dup {
				return fmt.Errorf("environment variable %q twice", key)
			}
			d.Env[key] = value
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("environment: %w", err)
	}
	if err := p.literal(")"); err != nil {
		return nil, err
	}
	if p.i != len(p.s) {
		return nil, errors.New("trailing bytes after the derivation")
	}
	return d, nil
}

// checkOutput accepts the output forms Nix writes: input-addressed (a
// path, no hash), fixed ("sha256"/"r:sha256"/"text:sha256" and a base-16
// digest), floating or impure content-addressed (no path, an algorithm,
// no hash or "impure"), deferred (all empty).
func checkOutput(name string, out *DerivationOutput) error {
	if name == "" {
		return errors.New("an output without a name")
	}
	if out.Path != "" {
		if err := checkStorePath(out.Path); err != nil {
			return fmt.Errorf("output %s path %q: %w", name, out.Path, err)
		}
	}
	if out.HashAlgo == "" {
		if out.Hash != "" {
			return fmt.Errorf("output %s has a hash but no algorithm", name)
		}
		return nil
	}
	algo := out.HashAlgo
	if rest, ok := strings.CutPrefix(algo, "r:"); ok {
		algo = rest
	} else if rest, ok := strings.CutPrefix(algo, "text:"); ok {
		algo = rest
	}
	size := digestSize(algo)
	if size == 0 {
		return fmt.Errorf("output %s: unknown hash algorithm %q", name, out.HashAlgo)
	}
	switch out.Hash {
	case "":
		return nil
	case "impure":
		out.Hash = "" // built anew each time: not fixed
		return nil
	}
	if len(out.Hash) != hex.EncodedLen(size) {
		return fmt.Errorf("output %s: %s hash %q is not %d hex digits", name, algo, out.Hash, hex.EncodedLen(size))
	}
	if _, err := hex.DecodeString(out.Hash); err != nil || strings.ToLower(out.Hash) != out.Hash {
		return fmt.Errorf("output %s: hash %q is not lower-case base 16", name, out.Hash)
	}
	if out.Path == "" {
		return fmt.Errorf("fixed output %s has no path", name)
	}
	return nil
}

func (p *atermParser) literal(lit string) error {
	if !bytes.HasPrefix(p.s[p.i:], []byte(lit)) {
		return fmt.Errorf("expected %q", lit)
	}
	p.i += len(lit)
	return nil
}

// list reads "[" elem ("," elem)* "]" or "[]".
func (p *atermParser) list(elem func() error) error {
	if err := p.literal("["); err != nil {
		return err
	}
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		if p.i >= len(p.s) {
			return errors.New("unterminated list")
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return nil
		default:
			return errors.New(`expected "," or "]"`)
		}
	}
}

// tuple reads "(" fields ")".
func (p *atermParser) tuple(fields func() error) error {
	if err := p.literal("("); err != nil {
		return err
	}
	if err := fields(); err != nil {
		return err
	}
	return p.literal(")")
}

func (p *atermParser) strings() ([]string, error) {
	out := []string{}
	err := p.list(func() error {
		s, err := p.str()
		out = append(out, s)
		return err
	})
	return out, err
}

// next reads "," and a string.
func (p *atermParser) next() (string, error) {
	if err := p.literal(","); err != nil {
		return "", err
	}
	return p.str()
}

// str reads a quoted string, undoing Nix's escapes.
func (p *atermParser) str() (string, error) {
	if err := p.literal(`"`); err != nil {
		return "", err
	}
	start := p.i
	// Most strings have no escapes: slice them.
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case '"':
			s := string(p.s[start:p.i])
			p.i++
			return s, nil
		case '\\':
			return p.escapedStr(start)
		}
		p.i++
	}
	return "", errors.New("unterminated string")
}

func (p *atermParser) escapedStr(start int) (string, error) {
	var b strings.Builder
	b.Write(p.s[start:p.i])
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch c {
		case '"':
			return b.String(), nil
		case '\\':
			if p.i >= len(p.s) {
				return "", errors.New("unterminated string")
			}
			c = p.s[p.i]
			p.i++
			switch c {
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			case '"', '\\':
			default:
				return "", fmt.Errorf("unknown escape \\%c", c)
			}
		}
		b.WriteByte(c)
	}
	return "", errors.New("unterminated string")
}
