package proxy

import (
	"bufio"
	"net"
	"sync/atomic"
	"time"
)

// serverConn is one connection to the database server: its socket, its reader and
// writer, and the protocol state the server reports on it (transaction status, the
// ParameterStatus values the proxy acts on, BackendKeyData). A session (conn) holds one
// from its startup to its end; everything the server connection knows is kept here and
// not in the session, so that a session could give its server connection back and be
// served by another one (transaction pooling), while what the client set up (prepared
// statements, the rewriting bookkeeping) stays with the session.
type serverConn struct {
	nc net.Conn // under conn.mu while the session holds it (close may come from anywhere)
	r  msgReader
	w  *bufio.Writer

	txStatus atomic.Uint32 // last ReadyForQuery status: txIdle, txInBlock or txFailed; 0 before the first
	key      string        // the BackendKeyData the server sent: process ID and secret

	// unsafeEncoding is set while the client_encoding the server last reported in a
	// ParameterStatus is one whose multibyte characters may hold ASCII bytes: the proxy
	// then cannot find the rows of text or CSV COPY data.
	unsafeEncoding atomic.Bool
	// timeFormat is how the server prints a timestamptz (DateStyle and TimeZone as it
	// last reported them), for the proxy's own leaf_decode answers; timeParams is its
	// source, touched only by whoever reads the server.
	timeFormat atomic.Pointer[timeFormat]
	timeParams timeFormat

	born   time.Time // when it was dialed; server-lifetime ends its reuse
	params [][]byte  // ParameterStatus bodies, recorded when it may serve later sessions
}

// newServerConn returns a server connection over nc, whose messages may be maxBody bytes
// long.
func newServerConn(nc net.Conn, maxBody int) *serverConn {
	return &serverConn{
		nc:   nc,
		born: time.Now(),
		r:    msgReader{br: bufio.NewReaderSize(nc, readBufferSize), maxBody: maxBody},
		w:    bufio.NewWriterSize(nc, writeBufferSize),
	}
}

// start sends the startup packet, which the server must answer before deadline.
func (sc *serverConn) start(packet []byte, deadline time.Time) error {
	_ = sc.nc.SetDeadline(deadline)
	if _, err := sc.w.Write(packet); err != nil {
		return err
	}
	return sc.w.Flush()
}
