package proxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Buffer sizes of the four buffered streams of a session. They bound the proxy's memory
// per idle connection (see the package's idle-memory test); messages larger than a
// buffer are streamed through it rather than held whole.
const (
	readBufferSize  = 8 << 10
	writeBufferSize = 8 << 10

	// keepBufferSize is the largest body buffer a session keeps between messages; a
	// larger one, needed for one big message, is dropped again right after it.
	keepBufferSize = 8 << 10
)

// Startup packet limits, as in PostgreSQL's postmaster (MAX_STARTUP_PACKET_LENGTH).
const (
	maxStartupPacketLen = 10000
	minStartupPacketLen = 8
)

// Request codes of the untyped packets a client may open a connection with.
const (
	sslRequestCode     = 80877103
	gssEncRequestCode  = 80877104
	cancelRequestCode  = 80877102
	protocolMajor3     = 3
	defaultMaxBodySize = 1 << 30
)

// errMessageTooLarge reports a message whose declared length exceeds MaxMessageSize.
var errMessageTooLarge = errors.New("message exceeds the maximum message size")

// msgReader reads typed protocol messages (one type byte, a four-byte length, a body) from
// a buffered stream. It lets the caller either stream the body on unchanged or read it
// whole for decoding.
type msgReader struct {
	br      *bufio.Reader
	maxBody int
	body    []byte // reused for decoded bodies up to keepBufferSize
}

// next reads the header of the next message and returns its type and body length.
func (r *msgReader) next() (typ byte, n int, err error) {
	if typ, n, err = r.peekHeader(); err != nil {
		return 0, 0, err
	}
	_, _ = r.br.Discard(5)
	return typ, n, nil
}

// peekHeader returns the type and body length of the next message, checked against the
// limits, without consuming its header.
func (r *msgReader) peekHeader() (typ byte, n int, err error) {
	h, err := r.br.Peek(5)
	if err != nil {
		if err == io.EOF && len(h) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, err
	}
	typ = h[0]
	l := int64(int32(binary.BigEndian.Uint32(h[1:5])))
	if l < 4 {
		return 0, 0, fmt.Errorf("invalid message length %d for message type %q", l, typ)
	}
	if l-4 > int64(r.maxBody) {
		return 0, 0, fmt.Errorf("%w: %d bytes in message type %q (limit %d)", errMessageTooLarge, l-4, typ, r.maxBody)
	}
	return typ, int(l - 4), nil
}

// readBody reads a body of n bytes whole. The slice is valid until the next readBody.
func (r *msgReader) readBody(n int) ([]byte, error) {
	if n <= r.br.Buffered() {
		// Common case: the body is already buffered; take a copy so that the caller
		// may keep using the reader.
		p, _ := r.br.Peek(n)
		b := r.buffer(n)
		copy(b, p)
		_, _ = r.br.Discard(n)
		return b, nil
	}
	if n > keepBufferSize {
		return r.readLarge(n)
	}
	b := r.buffer(n)
	if _, err := io.ReadFull(r.br, b); err != nil {
		return nil, unexpected(err)
	}
	return b, nil
}

// readLarge reads a body too big to keep, growing its buffer as the bytes arrive, so
// that memory follows what the peer sent and not what its header announced: a client
// that promises a 1 GB message and sends 12 bytes must not cost 1 GB.
func (r *msgReader) readLarge(n int) ([]byte, error) {
	b := make([]byte, 0, keepBufferSize)
	for len(b) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(cap(b), n-len(b)))
		}
		m, err := r.br.Read(b[len(b):min(cap(b), n)])
		b = b[:len(b)+m]
		if err != nil && len(b) < n {
			return nil, unexpected(err)
		}
	}
	return b, nil
}

func (r *msgReader) buffer(n int) []byte {
	if n > keepBufferSize {
		return make([]byte, n)
	}
	if cap(r.body) < n {
		// Grow in powers of two from a small start: most decoded bodies are tiny
		// (ReadyForQuery is one byte) and an idle session should not hold 8 KiB for them.
		size := 64
		for size < n {
			size *= 2
		}
		r.body = make([]byte, size)
	}
	return r.body[:n]
}

// copyBody streams a body of n bytes to w without holding it whole.
func (r *msgReader) copyBody(w *bufio.Writer, n int) error {
	if n <= r.br.Buffered() {
		// The usual case, a body already buffered whole: one copy, no loop.
		p, _ := r.br.Peek(n)
		if _, err := w.Write(p); err != nil {
			return writeError{err}
		}
		_, _ = r.br.Discard(n)
		return nil
	}
	for n > 0 {
		if r.br.Buffered() == 0 {
			if _, err := r.br.Peek(1); err != nil {
				return unexpected(err)
			}
		}
		chunk := min(n, r.br.Buffered())
		p, _ := r.br.Peek(chunk)
		if _, err := w.Write(p); err != nil {
			return writeError{err}
		}
		_, _ = r.br.Discard(chunk)
		n -= chunk
	}
	return nil
}

// writeHeader writes a message header for a body of n bytes.
func writeHeader(w *bufio.Writer, typ byte, n int) error {
	// Appending to the writer's own free space keeps the header off the heap.
	h := append(w.AvailableBuffer(), typ)
	h = binary.BigEndian.AppendUint32(h, uint32(n+4))
	_, err := w.Write(h)
	return err
}

// writeError marks a failure to write to the other side, as opposed to reading from
// this one.
type writeError struct{ err error }

func (e writeError) Error() string { return e.err.Error() }
func (e writeError) Unwrap() error { return e.err }

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readStartupPacket reads one untyped startup packet (length, code, payload) directly from
// the connection. It deliberately does not buffer: bytes a client sends after an
// SSLRequest must not be read before the TLS handshake (CVE-2021-23214 in PostgreSQL).
func readStartupPacket(r io.Reader) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	l := int(int32(binary.BigEndian.Uint32(h[:])))
	if l < minStartupPacketLen || l > maxStartupPacketLen {
		return nil, fmt.Errorf("invalid length of startup packet: %d", l)
	}
	p := make([]byte, l)
	copy(p, h[:])
	if _, err := io.ReadFull(r, p[4:]); err != nil {
		return nil, unexpected(err)
	}
	return p, nil
}

// Severities of the errors the proxy reports or reads.
const (
	severityError = "ERROR" // the statement fails, the session goes on
	severityFatal = "FATAL" // the session ends
	severityPanic = "PANIC" // the server ends every session (only the server sends it)
)

// fatal encodes a FATAL ErrorResponse.
func fatal(code, message string) []byte { return fatalDetail(code, message, "") }

// fatalDetail is fatal with a DETAIL field (empty: none).
func fatalDetail(code, message, detail string) []byte {
	return encodeError(&pgproto3.ErrorResponse{Severity: severityFatal, Code: code, Message: message, Detail: detail})
}
