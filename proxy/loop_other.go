//go:build !linux

package proxy

import "errors"

// Event loops need epoll; elsewhere every session has a goroutine pair.

type loopGroup struct{}

// loopSession is never made here: conn.loop stays nil, and engine() returns the pair.
type loopSession struct{}

func (s *Server) adopt(*conn) bool { return false }

// SendBatchSupport reports why the event loops cannot send their writes in batches over
// io_uring here: there are no event loops.
func SendBatchSupport() error { return errors.New("event loops need Linux") }

func (*loopGroup) running() int { return 0 }
func (*loopGroup) close()       {}

func (*loopSession) whenQuiet(func() bool) {}
func (*loopSession) drainClient()          {}
func (*loopSession) detach()               {}
func (*loopSession) abort()                {}

func (s *Server) adoptPooled(*conn, *pooledConn) bool { return false }
func (s *Server) txOnLoops() bool                     { return false }

// inRuntimePoller has nothing to do here: without event loops, every server connection
// is in the runtime's poller.
func (*serverConn) inRuntimePoller() error { return nil }
