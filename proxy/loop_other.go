//go:build !linux

package proxy

// Event loops need epoll; elsewhere every session has a goroutine pair.

type loopGroup struct{}

type loopSession struct{ detached bool }

func (s *Server) adopt(*conn) bool { return false }

func (*loopGroup) running() int { return 0 }

func (*loopSession) startDrain()         {}
func (*loopSession) requestCloseIfIdle() {}
func (*loopSession) detach()             {}
