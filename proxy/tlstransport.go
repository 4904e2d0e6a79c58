package proxy

import (
	"io"
	"net"
)

// tlsTransport is the socket under a TLS connection of a session. Until an event loop
// adopts the session it is the socket itself. A loop serves the session from a duplicate
// of the socket's descriptor and points the transport at its non-blocking reader and
// writer, so that the same TLS connection, with its keys and sequence numbers, goes on
// over the loop. When the loop hands the session to goroutines, the transport moves to a
// connection over that descriptor, and writes first what the loop had not written yet.
type tlsTransport struct {
	net.Conn
	r       io.Reader // while a loop serves the session
	w       io.Writer // while a loop serves the session
	pending []byte    // raw output a loop left unwritten, written before anything else
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
	if len(t.pending) > 0 {
		if _, err := t.Conn.Write(t.pending); err != nil {
			return 0, err
		}
		t.pending = nil
	}
	return t.Conn.Write(p)
}
