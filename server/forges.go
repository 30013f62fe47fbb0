package server

import (
	"net/http"

	"gradient.dev/gradient/server/forgehook"
	"gradient.dev/gradient/server/forgelink"
	"gradient.dev/gradient/server/forgestatus"
)

// forges is the server's forge integration: projects' links (sealed
// under the dial key), the webhook endpoints and the commit-status
// poster.
type forges struct {
	links  *forgelink.Links
	hooks  *forgehook.Hooks // nil without a job loop that can start evaluations
	poster *forgestatus.Poster
}

// startForges builds the forge integration and starts its poster.
func (s *Server) startForges() {
	f := &forges{links: forgelink.New(s.db, s.cfg.DialKey, s.cfg.ForgeHTTPClient)}
	f.poster = forgestatus.New(forgestatus.Config{
		DB: s.db, Links: f.links, ExternalURL: s.cfg.ExternalURL, Logger: s.log, Metrics: s.metrics.registry,
		Interval: s.cfg.ForgeStatusInterval, MinBackoff: s.cfg.ForgeStatusMinBackoff,
		Owner: s.cfg.Instance.ID(),
	})
	if ctl, ok := s.cfg.Jobs.(forgehook.Evaluations); ok && ctl != nil {
		f.hooks = forgehook.New(forgehook.Config{
			DB: s.db, Links: f.links, Evaluations: ctl, Gate: s.gate, Logger: s.log, Metrics: s.metrics.registry,
			Changed: f.poster.Nudge,
		})
	}
	s.forges = f
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f.poster.Run(s.ctx)
		if f.hooks != nil {
			f.hooks.Close()
		}
	}()
}

// mountForges mounts the webhook endpoints.
func (s *Server) mountForges(mux *http.ServeMux) {
	if s.forges.hooks != nil {
		s.forges.hooks.Mount(mux)
	}
}
