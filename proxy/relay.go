package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// relayToUpstream forwards client messages until the client leaves.
func (c *conn) relayToUpstream() error {
	if c.server.w.Buffered() > 0 {
		// Output left over from an event loop that handed the session over.
		if err := c.server.w.Flush(); err != nil {
			return err
		}
	}
	for {
		if done, err := c.clientStep(); done {
			return err
		}
	}
}

// clientStep handles the next client message, reporting done when the client side has
// ended (Terminate, end of stream or an error). Writes are batched: the upstream buffer
// is flushed only when no further client input is already buffered, so a pipeline of
// messages travels in as few writes as possible.
func (c *conn) clientStep() (done bool, err error) {
	typ, n, err := c.cr.next()
	if err != nil {
		return true, c.clientReadFailed(err)
	}
	err = c.fromClient(typ, n)
	if err == nil && (typ == clientTerminate || c.cr.br.Buffered() == 0) {
		if err = c.server.w.Flush(); err != nil {
			err = writeError{err}
		}
	}
	if err != nil {
		var we writeError
		if errors.As(err, &we) {
			c.tellClient(sqlstate.ConnectionFailure, "server closed the connection unexpectedly")
		}
		return true, err
	}
	return typ == clientTerminate, nil
}

// fromClient handles one client message whose header has been read. Messages that start
// a request cycle are counted so that the proxy knows when nothing is outstanding; all
// others cross unchanged.
func (c *conn) fromClient(typ byte, n int) error {
	if c.srv.Rewriter != nil {
		return c.fromClientRewriting(typ, n)
	}
	switch typ {
	case clientQuery, clientSync, clientFunctionCall:
		// Query, Sync and FunctionCall are each answered by exactly one ReadyForQuery,
		// whatever happens in between (errors included).
		c.pending.Add(1)
	}
	if err := writeHeader(c.server.w, typ, n); err != nil {
		return writeError{err}
	}
	return c.cr.copyBody(c.server.w, n)
}

// clientReadFailed ends the client side after a failed read. A client that just goes away
// at a message boundary is treated like one that sent Terminate, so that the upstream
// backend ends quietly instead of logging an unexpected EOF.
func (c *conn) clientReadFailed(err error) error {
	if errors.Is(err, io.EOF) {
		_ = writeHeader(c.server.w, clientTerminate, 0)
		_ = c.server.w.Flush()
		return nil
	}
	switch {
	case errors.Is(err, errMessageTooLarge):
		c.tellClient(sqlstate.ProgramLimitExceeded, err.Error())
		c.drainClient()
	case !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) && !isNetError(err):
		c.tellClient(sqlstate.ProtocolViolation, err.Error())
		c.drainClient()
	}
	return err
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// tellClient sends a final FATAL error to the client unless a response is being relayed at
// this moment, in which case a message of ours would corrupt the stream.
func (c *conn) tellClient(code, message string) {
	if !c.cwMu.TryLock() {
		return
	}
	if !c.told.CompareAndSwap(false, true) {
		c.cwMu.Unlock()
		return
	}
	defer c.cwMu.Unlock()
	_ = c.client.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.cw.Write(fatal(code, message))
	_ = c.cw.Flush()
}

// relayToClient forwards upstream messages until the upstream connection ends.
func (c *conn) relayToClient() error {
	c.cwMu.Lock()
	err := c.cw.Flush() // output left over from an event loop, if any
	c.cwMu.Unlock()
	if err != nil {
		return err
	}
	for {
		if done, err := c.upstreamStep(); done {
			return err
		}
	}
}

// upstreamStep handles the next upstream message, reporting done when the upstream side
// has ended (after a FATAL error, at the end of the stream or on an error). The client
// buffer is flushed when no further upstream input is buffered.
func (c *conn) upstreamStep() (done bool, err error) {
	typ, n, err := c.server.r.next()
	if err != nil {
		return true, c.upstreamReadFailed(err)
	}
	c.cwMu.Lock()
	sawFatal, err := c.fromUpstream(typ, n)
	if err == nil && c.server.r.br.Buffered() == 0 {
		err = c.cw.Flush()
	}
	c.cwMu.Unlock()
	if err != nil {
		return true, err
	}
	// The backend ends the session after a FATAL; so does the proxy, once the error has
	// reached the client.
	return sawFatal, nil
}

// fromUpstream handles one upstream message whose header has been read, reporting whether
// it was a FATAL (or PANIC) error.
func (c *conn) fromUpstream(typ byte, n int) (fatal bool, err error) {
	if c.srv.Rewriter != nil {
		return c.fromUpstreamRewriting(typ, n)
	}
	switch typ {
	case serverReadyForQuery:
		body, err := c.server.r.readBody(n)
		if err != nil {
			return false, err
		}
		if len(body) != 1 {
			return false, fmt.Errorf("ReadyForQuery of %d bytes", len(body))
		}
		c.server.txStatus.Store(uint32(body[0]))
		c.pending.Add(-1)
		return false, c.writeClient(typ, body)
	case serverErrorResponse:
		body, err := c.server.r.readBody(n)
		if err != nil {
			return false, err
		}
		return isFatal(body), c.writeClient(typ, body)
	}
	if err := writeHeader(c.cw, typ, n); err != nil {
		return false, err
	}
	return false, c.server.r.copyBody(c.cw, n)
}

// upstreamReadFailed tells the client, in PostgreSQL's words, that the server went away
// without a FATAL of its own (killed backend, crashed server, network failure).
func (c *conn) upstreamReadFailed(err error) error {
	if c.isClosed() {
		return nil
	}
	if errors.Is(err, errParked) {
		return err // transaction mode: the session parks (park.go)
	}
	if errors.Is(err, errMessageTooLarge) {
		c.tellClient(sqlstate.ProgramLimitExceeded, "the server sent a message larger than the proxy's limit: "+err.Error())
		return err
	}
	c.log.WithError(err).Info("upstream connection lost")
	c.tellClient(sqlstate.ConnectionFailure, "server closed the connection unexpectedly")
	return err
}

// isFatal reports whether an ErrorResponse body has severity FATAL or PANIC. The
// unlocalized severity (V) decides when present; S may be translated.
func isFatal(body []byte) bool {
	severity := errorField(body, fieldSeverityUnlocalized)
	if severity == nil {
		severity = errorField(body, fieldSeverity)
	}
	s := string(severity)
	return s == severityFatal || s == severityPanic
}
