//go:build !linux

package proxy

// Event loops need epoll; elsewhere every session has a goroutine pair.

type loopGroup struct{}

type loopSession struct{}

func (s *Server) adopt(*conn) bool { return false }

func (*loopGroup) running() int { return 0 }

// loopSession is never used: it implements engine for conn.loop, always nil here.
func (*loopSession) whenQuiet(func() bool) {}
func (*loopSession) drainClient()          {}
func (*loopSession) detach()               {}
func (*loopSession) abort()                {}
