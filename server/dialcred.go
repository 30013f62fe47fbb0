package server

import (
	"context"
	"errors"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// Server-dialed workers (docs/protocol/connection.md, "Server-Dialed Handshake"): the
// server proves itself to a worker it dials with the tokens of the
// registrations at that URL. Storage keeps tokens only as argon2id hashes
// for authenticating workers, so a registration or team worker with a URL
// also keeps its token sealed under the server's dial key (Config.DialKey),
// bound to its identity. The methods here create and rotate credentials
// with that sealed copy; the admin API calls them instead of storage's.

// ErrNoDialKey: a URL was set but the server has no key to seal the token
// with. It matches storage.ErrInvalid, so the admin API answers 400.
var ErrNoDialKey error = noDialKeyError{}

type noDialKeyError struct{}

func (noDialKeyError) Error() string {
	return "server-dialed workers need a dial key: set --dial-key-file"
}

func (noDialKeyError) Is(target error) bool { return target == storage.ErrInvalid }

// Additional data binding a sealed token to its owner: a sealed value
// copied to another row does not open.
func registrationIdentity(peer storage.Peer, workerID string) []byte {
	return []byte("gradient dial token\x00registration\x00" + string(peer.Kind) + "\x00" + peer.ID + "\x00" + workerID)
}

func teamWorkerIdentity(teamID, workerID string) []byte {
	return []byte("gradient dial token\x00team worker\x00" + teamID + "\x00" + workerID)
}

// canDial refuses a URL the server could not present a token at.
func (s *Server) canDial(settings storage.WorkerSettings) error {
	if settings.URL != "" && s.cfg.DialKey == nil {
		return ErrNoDialKey
	}
	return nil
}

// openToken opens a sealed token; ok is false without a key, or when the
// value was sealed under another key or for another owner.
func (s *Server) openToken(sealed, identity []byte) (token string, ok bool) {
	if s.cfg.DialKey == nil || len(sealed) == 0 {
		return "", false
	}
	plain, err := s.cfg.DialKey.Open(sealed, identity)
	if err != nil {
		return "", false
	}
	return string(plain), true
}

// dialTokens are the (peer, token) pairs a dial of target presents: one per
// registration whose sealed token opens, or the team ID with the team
// worker's token. Tokens that do not open are left out with a warning.
func (s *Server) dialTokens(target storage.DialTarget) []wire.Pair[string, string] {
	var tokens []wire.Pair[string, string]
	add := func(peerID string, sealed, identity []byte) {
		token, ok := s.openToken(sealed, identity)
		if !ok {
			s.log.Warn("no usable dial token: rotate the token to dial with it",
				"worker", target.WorkerID, "peer", peerID, "sealed", len(sealed) > 0)
			return
		}
		tokens = append(tokens, wire.Pair[string, string]{First: peerID, Second: token})
	}
	for _, reg := range target.Registrations {
		add(reg.Peer.ID, reg.DialTokenSealed, registrationIdentity(reg.Peer, reg.WorkerID))
	}
	if tw := target.TeamWorker; tw != nil {
		add(tw.TeamID, tw.DialTokenSealed, teamWorkerIdentity(tw.TeamID, tw.WorkerID))
	}
	return tokens
}

// CreateRegistration is storage's CreateRegistration that also seals the
// token of a worker the server dials (settings.URL set; ErrNoDialKey
// without a key). The token is returned once: the worker's peers file,
// or for a dialed worker its accepted-server-tokens file
// (AcceptedServerTokenLine), needs it.
func (s *Server) CreateRegistration(ctx context.Context, peer storage.Peer, workerID string, settings storage.WorkerSettings) (storage.Registration, string, error) {
	if err := s.canDial(settings); err != nil {
		return storage.Registration{}, "", err
	}
	reg, token, err := s.db.CreateRegistration(ctx, peer, workerID, settings)
	if err != nil || settings.URL == "" {
		return reg, token, err
	}
	if reg.DialTokenSealed, err = s.sealRegistration(ctx, reg, token); err != nil {
		// Without its sealed token the server could never dial the worker.
		undo := s.db.DeleteRegistration(context.WithoutCancel(ctx), reg.Peer, reg.WorkerID)
		return storage.Registration{}, "", errors.Join(err, undo)
	}
	return reg, token, nil
}

// CreateTeamWorker is storage's CreateTeamWorker that also seals the token
// of a team worker the server dials; see CreateRegistration.
func (s *Server) CreateTeamWorker(ctx context.Context, teamID, workerID string, settings storage.WorkerSettings) (storage.TeamWorker, string, error) {
	if err := s.canDial(settings); err != nil {
		return storage.TeamWorker{}, "", err
	}
	w, token, err := s.db.CreateTeamWorker(ctx, teamID, workerID, settings)
	if err != nil || settings.URL == "" {
		return w, token, err
	}
	if w.DialTokenSealed, err = s.sealTeamWorker(ctx, w, token); err != nil {
		undo := s.db.DeleteTeamWorker(context.WithoutCancel(ctx), w.WorkerID)
		return storage.TeamWorker{}, "", errors.Join(err, undo)
	}
	return w, token, nil
}

// RotateRegistrationToken replaces a registration's token (shown once) and
// reseals it when the server dials the worker.
func (s *Server) RotateRegistrationToken(ctx context.Context, peer storage.Peer, workerID string) (string, error) {
	reg, err := s.db.Registration(ctx, peer, workerID)
	if err != nil {
		return "", err
	}
	if err := s.canDial(reg.WorkerSettings); err != nil {
		return "", err // rotating would drop the sealed token for good
	}
	token, err := s.db.RotateRegistrationToken(ctx, reg.Peer, reg.WorkerID)
	if err != nil || reg.URL == "" {
		return token, err
	}
	_, err = s.sealRegistration(ctx, reg, token)
	return token, err
}

// RotateTeamWorkerToken is RotateRegistrationToken for a team worker.
func (s *Server) RotateTeamWorkerToken(ctx context.Context, workerID string) (string, error) {
	w, err := s.db.TeamWorker(ctx, workerID)
	if err != nil {
		return "", err
	}
	if err := s.canDial(w.WorkerSettings); err != nil {
		return "", err
	}
	token, err := s.db.RotateTeamWorkerToken(ctx, w.WorkerID)
	if err != nil || w.URL == "" {
		return token, err
	}
	_, err = s.sealTeamWorker(ctx, w, token)
	return token, err
}

// UpdateRegistration is storage's UpdateRegistration. Setting a URL on a
// registration whose token the server does not hold sealed rotates the
// token, since only the worker knows the old one: newToken is then set
// and shown once; otherwise it is "".
func (s *Server) UpdateRegistration(ctx context.Context, peer storage.Peer, workerID string, settings storage.WorkerSettings) (newToken string, err error) {
	if err := s.canDial(settings); err != nil {
		return "", err
	}
	if err := s.db.UpdateRegistration(ctx, peer, workerID, settings); err != nil {
		return "", err
	}
	defer s.RefreshDials()
	reg, err := s.db.Registration(ctx, peer, workerID)
	if err != nil || reg.URL == "" || reg.DialTokenSealed != nil {
		return "", err
	}
	token, err := s.db.RotateRegistrationToken(ctx, reg.Peer, reg.WorkerID)
	if err != nil {
		return "", err
	}
	_, err = s.sealRegistration(ctx, reg, token)
	return token, err
}

// UpdateTeamWorker is UpdateRegistration for a team worker.
func (s *Server) UpdateTeamWorker(ctx context.Context, workerID string, settings storage.WorkerSettings) (newToken string, err error) {
	if err := s.canDial(settings); err != nil {
		return "", err
	}
	if err := s.db.UpdateTeamWorker(ctx, workerID, settings); err != nil {
		return "", err
	}
	defer s.RefreshDials()
	w, err := s.db.TeamWorker(ctx, workerID)
	if err != nil || w.URL == "" || w.DialTokenSealed != nil {
		return "", err
	}
	token, err := s.db.RotateTeamWorkerToken(ctx, w.WorkerID)
	if err != nil {
		return "", err
	}
	_, err = s.sealTeamWorker(ctx, w, token)
	return token, err
}

// sealRegistration stores the sealed copy of a dialed registration's new
// token and has the dialer pick it up.
func (s *Server) sealRegistration(ctx context.Context, reg storage.Registration, token string) ([]byte, error) {
	sealed := s.cfg.DialKey.Seal([]byte(token), registrationIdentity(reg.Peer, reg.WorkerID))
	if err := s.db.SetRegistrationDialToken(ctx, reg.Peer, reg.WorkerID, sealed); err != nil {
		return nil, err
	}
	s.RefreshDials()
	return sealed, nil
}

func (s *Server) sealTeamWorker(ctx context.Context, w storage.TeamWorker, token string) ([]byte, error) {
	sealed := s.cfg.DialKey.Seal([]byte(token), teamWorkerIdentity(w.TeamID, w.WorkerID))
	if err := s.db.SetTeamWorkerDialToken(ctx, w.WorkerID, sealed); err != nil {
		return nil, err
	}
	s.RefreshDials()
	return sealed, nil
}
