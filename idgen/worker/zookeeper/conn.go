package zookeeper

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
)

// The lease owns one client connection at a time. The client reconnects by itself, but
// zk.Conn (v1.0.4) has no deadline per request: a request ends only with its answer, with
// the death of the TCP connection (no bytes for two thirds of the session timeout), or
// with Close. So a request can wait far longer than a session timeout:
//   - once sent, on a connection whose server keeps answering pings but not the request;
//   - while queued (sendChan), behind a reconnect whose handshake waits for an answer for
//     ten receive timeouts (authenticate: 40 s with a 6 s session) on a server that
//     accepted the TCP connection but does not answer.
// Reports therefore wait a bounded time for each request and, past the bound, replace the
// connection. The node is persistent and bound to ip:port, so any session may rewrite it;
// but closing the old connection ends its session and the liveness claim with it, so the
// lease ends and the engine claims the worker ID again.

// errNoAnswer is the error of a request that got no answer within the bound.
var errNoAnswer = errors.New("no answer from ZooKeeper")

// errNoConnection is the error of a report while no connection could be made.
var errNoConnection = errors.New("no ZooKeeper connection")

// dial connects a new client. Its events reach onEvent only while it is the current
// connection: the generation is bumped first, so events of a replaced connection (its
// shutdown says "disconnected") are ignored.
func (l *lease) dial() (*zk.Conn, error) {
	l.mu.Lock()
	l.gen++
	gen := l.gen
	l.mu.Unlock()
	s := l.src.s
	c, _, err := zk.Connect(s.Servers, s.SessionTimeout,
		zk.WithEventCallback(func(ev zk.Event) { l.onEvent(gen, ev) }),
		zk.WithLogger(zkLogger{s.Logger}), zk.WithLogInfo(false))
	if err != nil {
		return nil, fmt.Errorf("zookeeper worker source: %w", err)
	}
	return c, nil
}

// current returns the connection requests go to.
func (l *lease) current() *zk.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn
}

// answerBound is how long a report waits for one request: the client itself declares a
// silent connection dead after two thirds of the session timeout, so a request without an
// answer after a whole session timeout is stuck on a connection that looks alive.
func (l *lease) answerBound() time.Duration { return l.src.s.SessionTimeout }

// do runs fn on the current connection and waits at most answerBound for it. Only the
// report loop (or Close, after it) calls do, and do returns only once fn has returned, so
// there is never more than one request in flight: an older Set can never land after a
// newer one. When fn is stuck, do replaces the connection; closing the old one fails fn at
// once (zk.Conn.Close ends every waiting request).
func (l *lease) do(fn func(*zk.Conn) error) error {
	c := l.current()
	if c == nil {
		if c = l.connect(); c == nil {
			return errNoConnection
		}
	}
	done := make(chan error, 1)
	go func() { done <- fn(c) }()
	t := time.NewTimer(l.answerBound())
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	l.replace(c)
	<-done
	return fmt.Errorf("%w within %v; replaced the connection", errNoAnswer, l.answerBound())
}

// replace closes old and, unless the lease is closing, dials a new connection in its place.
func (l *lease) replace(old *zk.Conn) {
	l.logger().WithField("session_id", fmt.Sprintf("%#x", old.SessionID())).
		Warn("a ZooKeeper request got no answer within the session timeout; replacing the connection")
	l.mu.Lock()
	current := l.conn == old
	if current {
		l.conn = nil
		l.down = true // until the new session is there; onEvent then logs the reconnect
	}
	l.mu.Unlock()
	old.Close()
	if current && l.claimed {
		l.end("replaced the ZooKeeper connection, which ended the session and the worker ID's liveness claim")
	}
	if current {
		l.connect()
	}
}

// connect dials a new current connection, unless the lease is closing. It returns nil when
// there is none; the next report tries again.
func (l *lease) connect() *zk.Conn {
	select {
	case <-l.stop:
		return nil // Close closes whatever connection is current; no use dialling
	default:
	}
	c, err := l.dial()
	if err != nil {
		// zk.Connect fails when no server name resolves; that can pass.
		l.logger().WithError(err).Error("making a new ZooKeeper connection failed")
		return nil
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		c.Close()
		return nil
	}
	l.conn = c
	l.mu.Unlock()
	return c
}

// hasSession reports whether the current connection has a session.
func (l *lease) hasSession() bool {
	c := l.current()
	return c != nil && c.State() == zk.StateHasSession
}

// shutdown closes the current connection for good; no other is dialled after it.
func (l *lease) shutdown() {
	l.mu.Lock()
	l.closed = true
	c := l.conn
	l.conn = nil
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
}
