package proxy

import (
	"crypto/tls"
	"io"
	"net"
)

// tlsTransport is the socket under a TLS connection of a session. Until an event loop
// adopts the session it is the socket itself. A loop serves the session from a duplicate
// of the socket's descriptor and points the transport at its non-blocking reader and
// writer, so that the same TLS connection, with its keys and sequence numbers, goes on
// over the loop. When the loop hands the session to goroutines, the transport moves to a
// connection over that descriptor (resumeOn).
type tlsTransport struct {
	net.Conn
	r       io.Reader     // while a loop serves the session
	w       io.Writer     // while a loop serves the session
	carried chan struct{} // closed once the output a loop left unwritten is written
}

// resumeOn moves the transport to nc, writing pending, the raw output the loop left
// unwritten, ahead of anything else. The write runs on a goroutine of its own, at once
// and without waiting for the session's next message, so that output a peer waits for is
// not held back; a peer that does not read holds up only the writes to it.
func (t *tlsTransport) resumeOn(nc net.Conn, pending []byte) {
	t.Conn, t.r, t.w = nc, nil, nil
	if len(pending) == 0 {
		return
	}
	done := make(chan struct{})
	t.carried = done
	go func() {
		defer close(done)
		_, _ = nc.Write(pending) // a failure fails the connection's next read or write too
	}()
}

func (t *tlsTransport) Read(p []byte) (int, error) {
	if t.r != nil {
		return t.r.Read(p)
	}
	return t.Conn.Read(p)
}

func (t *tlsTransport) Write(p []byte) (int, error) {
	if t.w != nil {
		return t.w.Write(p)
	}
	if t.carried != nil {
		<-t.carried
	}
	return t.Conn.Write(p)
}

// socketUnder returns the socket under nc and, when nc is TLS over a tlsTransport, the
// transport; otherwise nc itself.
func socketUnder(nc net.Conn) (net.Conn, *tlsTransport) {
	if tc, ok := nc.(*tls.Conn); ok {
		if t, ok := tc.NetConn().(*tlsTransport); ok {
			return t.Conn, t
		}
	}
	return nc, nil
}
