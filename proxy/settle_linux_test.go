package proxy

import (
	"bufio"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSteadySession checks settle's shortcut: steady holds for a session in session mode
// with nothing to act on, and fails for each state in which one of settle's steps would
// act (end the session, give back memory, or change what the loop watches; whether to
// queue it for another turn, settle asks first).
func TestSteadySession(t *testing.T) {
	quiet := func() *loopSession {
		c := &conn{server: &serverConn{}}
		c.cr.br = bufio.NewReaderSize(nil, readBufferSize)
		c.server.r.br = bufio.NewReaderSize(nil, readBufferSize)
		ls := &loopSession{c: c}
		for _, end := range []*loopEnd{&ls.client, &ls.upstream} {
			end.ls, end.watched, end.events = ls, true, unix.EPOLLIN
		}
		return ls
	}
	if ls := quiet(); !ls.steady() {
		t.Fatal("a quiet session in session mode is not steady")
	}
	for _, tc := range []struct {
		name  string
		shake func(ls *loopSession)
	}{
		{"output pending for the client", func(ls *loopSession) { ls.client.sink.pending = []byte("x") }},
		{"output pending for the server", func(ls *loopSession) { ls.upstream.sink.pending = []byte("x") }},
		{"a large empty output buffer", func(ls *loopSession) { ls.client.sink.pending = make([]byte, 0, loopOutputLimit+1) }},
		{"the client gone", func(ls *loopSession) { ls.client.sink.err = unix.EPIPE }},
		{"the server gone", func(ls *loopSession) { ls.upstream.sink.err = unix.ECONNRESET }},
		{"streaming", func(ls *loopSession) { ls.streaming = 1 }},
		{"finishing", func(ls *loopSession) { ls.finishing = true }},
		{"torn down", func(ls *loopSession) { ls.dead = true }},
		{"transaction mode", func(ls *loopSession) { ls.tx = &pooledConn{} }},
		{"the client unwatched", func(ls *loopSession) { ls.client.watched = false }},
		{"the server watched for output", func(ls *loopSession) { ls.upstream.events |= unix.EPOLLOUT }},
		{"the client's reader grown", func(ls *loopSession) { ls.c.cr.br = bufio.NewReaderSize(nil, 2*readBufferSize) }},
		{"the server's reader grown", func(ls *loopSession) { ls.c.server.r.br = bufio.NewReaderSize(nil, 2*readBufferSize) }},
	} {
		ls := quiet()
		tc.shake(ls)
		if ls.steady() {
			t.Errorf("%s: steady, but settle has work to do", tc.name)
		}
	}
}
