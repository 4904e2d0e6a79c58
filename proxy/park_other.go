//go:build !linux

package proxy

// Without epoll, sessions in transaction mode are never parked (see park.go).
type parkLot struct{}

func (s *Server) parkLot() *parkLot         { return nil }
func (s *Server) existingParkLot() *parkLot { return nil }

func (l *parkLot) enter(*pooledConn) bool  { return false }
func (l *parkLot) leave(*pooledConn)       {}
func (l *parkLot) close()                  {}
func (l *parkLot) park(*pooledConn) bool   { return false }
func (l *parkLot) unpark(*pooledConn) bool { return false }
func (l *parkLot) parkedCount() int        { return 0 }
