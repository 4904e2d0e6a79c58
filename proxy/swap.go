package proxy

import (
	"errors"

	"github.com/leafproxy/leafproxy/rewrite"
)

// This file lets a running server take new fill rules. A Rewriter's fill rules are fixed
// when it is made, and its plan caches hold plans made under them; so new rules come as a
// whole new Rewriter, swapped in with one atomic store. A statement is then planned wholly
// by the old or wholly by the new one (conn.plan loads it once), and since the new one
// starts with empty caches, no plan made under the old rules is served after the swap.
// A statement prepared before the swap keeps the plan it was prepared with: its client
// has been told its parameters and columns, which the new rules may change; it gets the
// new rules when it is prepared again.

// SetRewriter replaces the Rewriter for every statement planned from now on, in every
// session, without dropping one. Rewriting must have been turned on by setting
// Server.Rewriter before Serve: SetRewriter swaps rewriters, it does not turn rewriting on
// or off, and refuses nil.
func (s *Server) SetRewriter(rw *rewrite.Rewriter) error {
	if rw == nil {
		return errors.New("proxy: SetRewriter(nil): rewriting cannot be turned off while serving")
	}
	if s.Rewriter == nil {
		return errors.New("proxy: SetRewriter needs Server.Rewriter set before Serve")
	}
	s.swapped.Store(rw)
	return nil
}

// rewriter returns the Rewriter in use: the last one SetRewriter stored, else Rewriter.
func (s *Server) rewriter() *rewrite.Rewriter {
	if rw := s.swapped.Load(); rw != nil {
		return rw
	}
	return s.Rewriter
}
