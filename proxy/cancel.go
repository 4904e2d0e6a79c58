package proxy

import (
	"context"
	"io"
	"sync"
	"time"
)

// cancelDrainTimeout bounds how long a forwarded cancel request waits for the upstream to
// acknowledge it by closing the connection.
const cancelDrainTimeout = 5 * time.Second

// cancelRegistry maps the cancel key a client was given (process ID and secret, as sent in
// BackendKeyData) to its session. Clients receive the upstream backend's own key, so the
// process ID a client sees is the real one (pg_backend_pid, NotificationResponse agree);
// the registry makes sure the proxy forwards only cancels for keys it handed out.
type cancelRegistry struct {
	mu   sync.Mutex
	keys map[string]*conn
}

func (r *cancelRegistry) add(key string, c *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys == nil {
		r.keys = make(map[string]*conn)
	}
	r.keys[key] = c
}

func (r *cancelRegistry) remove(key string, c *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys[key] == c {
		delete(r.keys, key)
	}
}

func (r *cancelRegistry) lookup(key string) *conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.keys[key]
}

// forwardCancel serves a client's CancelRequest packet. A key the proxy did not hand out
// is dropped: the proxy relays no cancel it cannot vouch for. Otherwise the request ends
// what the client is waiting for. What runs at the server is cancelled there: the packet
// goes to the upstream backend it names. A wait for an ID in progress (see
// conn.nextID) is ended too, and its statement fails with 57014; when that wait is all
// the session has outstanding, the backend is idle and nothing goes upstream, where a
// late cancel could only hit the session's next statement. When both are cancelled, the
// upstream goes first, so that the statement that follows the wait cannot be hit.
//
// Like PostgreSQL, the proxy never answers the client; it waits for the upstream to close
// the connection so that the client's own close happens after the cancel was processed.
func (s *Server) forwardCancel(ctx context.Context, packet []byte) {
	// The key is everything after the length and request code: process ID and secret.
	key := string(packet[8:])
	c := s.cancels.lookup(key)
	if c == nil {
		s.logger().Debug("cancel request with an unknown key ignored")
		return
	}
	addr := c.upstreamAddr
	if v := c.pooled(); v != nil {
		packet, addr = v.cancelTarget() // the server connection the session holds now, if any
	} else {
		packet = c.serverCancelPacket(packet)
	}
	if packet != nil && (c.pending.Load() != 0 || !c.waitingForID()) {
		s.cancelUpstream(ctx, addr, packet)
	}
	if c.cancelIDWait() {
		c.log.Debug("cancel request ended the wait for an ID")
	}
}

// cancelUpstream sends a CancelRequest packet to the upstream server at addr (the
// session's) and waits until the server has dealt with it.
func (s *Server) cancelUpstream(ctx context.Context, addr string, packet []byte) {
	uc, err := s.dialUpstream(ctx, addr)
	if err != nil {
		s.logger().WithError(err).Warn("cannot forward cancel request")
		return
	}
	defer uc.Close()
	_ = uc.SetDeadline(time.Now().Add(cancelDrainTimeout))
	if _, err := uc.Write(packet); err != nil {
		s.logger().WithError(err).Warn("cannot forward cancel request")
		return
	}
	_, _ = io.Copy(io.Discard, uc)
}
