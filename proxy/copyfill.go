package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/rewrite"
)

// copyIn is a COPY … FROM STDIN whose rows the proxy gives keys (rewrite.CopyFill). It
// starts when the proxy forwards the COPY, so that no CopyData the client sends passes
// unfilled, and ends with the client's CopyDone or CopyFail or with the ReadyForQuery of
// its cycle, whichever comes first.
type copyIn struct {
	cy     *cycle // the Query's cycle
	filler rowFiller
	keys   int  // key columns added to the COPY's column list
	failed bool // the proxy failed the COPY (CopyFail); the client's data is dropped
	// text is set for the text and CSV formats; checked once its encoding is known.
	text, checked bool
}

// rowFiller appends keys to the rows of a COPY data stream in one format: feed takes the
// stream's bytes as they come, finish the end of the stream (CopyDone). After an error
// (a malformed stream, an ID that could not be had) a filler takes nothing more.
type rowFiller interface {
	feed(dst, in []byte) ([]byte, error)
	finish(dst []byte) ([]byte, error)
}

// copyState is where a copyFiller is in the binary COPY format.
type copyState uint8

const (
	copyHeader      copyState = iota // signature, flags and header extension length
	copyExtension                    // the header extension
	copyTuple                        // a tuple's field count, or the trailer
	copyFieldLength                  // a field's length (-1: NULL)
	copyFieldData                    // a field's bytes
	copyEnd                          // after the trailer: the server judges anything more
)

// copySignature opens every COPY BINARY stream.
var copySignature = []byte("PGCOPY\n\xff\r\n\x00")

// copyHasOIDs is the header flag of a stream whose tuples carry OIDs (before
// PostgreSQL 12); the proxy cannot tell those apart from fields.
const copyHasOIDs = 1 << 16

// copyFiller rewrites a COPY BINARY data stream, whatever its division into CopyData
// messages, appending to every tuple one int8 field per key with a fresh ID. The binary
// format says how many fields a tuple has and how long each is, so the filler follows
// the tuples exactly; it streams field bytes through and holds only a header's, a field
// count's or a field length's few bytes across messages.
type copyFiller struct {
	keys   []rewrite.Slot
	nextID func(rewrite.Slot) (int64, error)
	state  copyState
	acc    []byte // bytes of a fixed-size item so far, when it spans messages
	left   int    // bytes of the header extension or of a field still to pass
	fields int    // fields of the current tuple still to pass
	err    error
}

// errCopyFormat reports a stream the filler cannot read as COPY BINARY.
var errCopyFormat = errors.New("COPY data is not in PostgreSQL's binary format")

// feed appends to dst the rewritten form of the next bytes of the stream. After an error
// (a malformed stream, an ID that could not be had) the filler takes nothing more.
func (f *copyFiller) feed(dst, in []byte) ([]byte, error) {
	for len(in) > 0 && f.err == nil {
		var item []byte
		switch f.state {
		case copyHeader:
			if item, in = f.take(in, len(copySignature)+8); item == nil {
				continue
			}
			flags := binary.BigEndian.Uint32(item[11:15])
			ext := int32(binary.BigEndian.Uint32(item[15:19]))
			switch {
			case !bytes.Equal(item[:11], copySignature):
				f.err = fmt.Errorf("%w: no binary COPY signature", errCopyFormat)
			case flags&copyHasOIDs != 0:
				f.err = fmt.Errorf("%w: tuples with OIDs", errCopyFormat)
			case ext < 0:
				f.err = fmt.Errorf("%w: header extension of %d bytes", errCopyFormat, ext)
			}
			dst = append(dst, item...)
			f.left, f.state = int(ext), copyExtension
			if f.left == 0 {
				f.state = copyTuple
			}
		case copyExtension, copyFieldData:
			n := min(f.left, len(in))
			dst = append(dst, in[:n]...)
			in, f.left = in[n:], f.left-n
			if f.left > 0 {
				continue
			}
			if f.state == copyExtension {
				f.state = copyTuple
				continue
			}
			f.fields--
			dst = f.endField(dst)
		case copyTuple:
			if item, in = f.take(in, 2); item == nil {
				continue
			}
			count := int(int16(binary.BigEndian.Uint16(item)))
			if count == -1 {
				dst = append(dst, item...)
				f.state = copyEnd
				continue
			}
			if count < 0 || count+len(f.keys) > math.MaxInt16 {
				f.err = fmt.Errorf("%w: a tuple of %d fields", errCopyFormat, count)
				continue
			}
			dst = binary.BigEndian.AppendUint16(dst, uint16(count+len(f.keys)))
			f.fields = count
			dst = f.endField(dst)
		case copyFieldLength:
			if item, in = f.take(in, 4); item == nil {
				continue
			}
			n := int(int32(binary.BigEndian.Uint32(item)))
			if n < -1 {
				f.err = fmt.Errorf("%w: a field of %d bytes", errCopyFormat, n)
				continue
			}
			dst = append(dst, item...)
			if n > 0 {
				f.left, f.state = n, copyFieldData
				continue
			}
			f.fields-- // NULL or empty
			dst = f.endField(dst)
		case copyEnd:
			dst = append(dst, in...)
			in = nil
		}
	}
	return dst, f.err
}

// finish checks nothing: the binary format ends with its own trailer, which the server
// checks.
func (f *copyFiller) finish(dst []byte) ([]byte, error) { return dst, f.err }

// take returns the next n bytes of a fixed-size item and the rest of in, gathering the
// item across messages; item is nil while it is incomplete. The item is valid until the
// next take.
func (f *copyFiller) take(in []byte, n int) (item, rest []byte) {
	if len(f.acc) == 0 && len(in) >= n {
		return in[:n], in[n:]
	}
	k := min(n-len(f.acc), len(in))
	f.acc = append(f.acc, in[:k]...)
	if len(f.acc) < n {
		return nil, in[k:]
	}
	item, f.acc = f.acc, f.acc[:0]
	return item, in[k:]
}

// endField moves on after a field: to the next field's length, or, after the tuple's
// last field, past the keys appended to it.
func (f *copyFiller) endField(dst []byte) []byte {
	if f.fields > 0 {
		f.state = copyFieldLength
		return dst
	}
	for _, k := range f.keys {
		id, err := f.nextID(k)
		if err != nil {
			f.err = err
			return dst
		}
		dst = binary.BigEndian.AppendUint32(dst, 8)
		dst = binary.BigEndian.AppendUint64(dst, uint64(id))
	}
	f.state = copyTuple
	return dst
}

// newCopyIn starts filling the keys of the COPY of cycle cy, which the proxy is about to
// forward.
func (c *conn) newCopyIn(cy *cycle, fill *rewrite.CopyFill) *copyIn {
	next := func(k rewrite.Slot) (int64, error) { return c.nextID(k, "") }
	ci := &copyIn{cy: cy, keys: len(fill.Keys), text: fill.Format.Kind != "binary"}
	if fill.Format.Kind == "binary" {
		ci.filler = &copyFiller{keys: fill.Keys, nextID: next}
	} else {
		ci.filler = newTextFiller(fill, next)
	}
	return ci
}

// onCopyIn handles a CopyData, CopyDone or CopyFail of a COPY whose rows get keys. When
// the data cannot be read as COPY BINARY or an ID cannot be had, the proxy fails the COPY
// with a CopyFail of its own: the server rolls the whole COPY back and reports the
// reason, and ignores the rest of the client's data, which the proxy drops.
func (c *conn) onCopyIn(ci *copyIn, typ byte, n int) error {
	body, err := c.cr.readBody(n)
	if err != nil {
		return err
	}
	ss := &c.sess
	if ci.text && !ci.checked && !ci.failed && typ != clientCopyFail {
		// The client sends data once it has the CopyInResponse, which the server sent
		// after the ParameterStatus of any client_encoding change before the COPY: the
		// encoding is known now, also when the COPY was pipelined behind the change.
		ci.checked = true
		if c.server.unsafeEncoding.Load() {
			if err := c.failCopy(ci, errUnsafeEncoding()); err != nil {
				return err
			}
			if typ != clientCopyData {
				c.endCopyIn(ci)
			}
			return nil
		}
	}
	if typ == clientCopyDone && !ci.failed {
		// CopyDone: a last row without a line end gets its keys first.
		out, err := ci.filler.finish(ss.outBuf[:0])
		if err != nil {
			err = c.failCopy(ci, err)
		} else if len(out) > 0 {
			err = c.send(clientCopyData, out)
			ss.outBuf = keepSmall(out)
		}
		if err != nil || ci.failed {
			c.endCopyIn(ci)
			return err
		}
	}
	if typ != clientCopyData {
		c.endCopyIn(ci)
		if ci.failed {
			return nil // the server has left the COPY already
		}
		return c.send(typ, body)
	}
	if ci.failed {
		return nil
	}
	out, err := ci.filler.feed(ss.outBuf[:0], body)
	if err != nil {
		return c.failCopy(ci, err)
	}
	ss.outBuf = keepSmall(out)
	if len(out) == 0 {
		return nil
	}
	return c.send(clientCopyData, out)
}

// endCopyIn ends the session's filled COPY ci.
func (c *conn) endCopyIn(ci *copyIn) {
	ss := &c.sess
	ss.mu.Lock()
	if ss.copyIn == ci {
		ss.copyIn = nil
	}
	ss.mu.Unlock()
}

// failCopy fails a filled COPY with a CopyFail of the proxy's own: the server rolls the
// whole COPY back, and the client gets the proxy's reason in place of the server's error.
func (c *conn) failCopy(ci *copyIn, err error) error {
	ss := &c.sess
	ci.failed = true
	c.log.WithError(err).Debug("failing a COPY whose rows get keys")
	r := errorResponse(err)
	if errors.Is(err, errCopyFormat) {
		r = errorResponse(&rewrite.Error{Code: sqlstate.BadCopyFileFormat, Message: err.Error(),
			Hint: "COPY … (FORMAT binary) data must be in PostgreSQL's binary COPY format."})
	}
	ss.mu.Lock()
	if ss.copyIn == ci { // else the COPY's cycle is over, and the server's word stands
		ci.cy.copyFailure = r
	}
	ss.mu.Unlock()
	return c.send(clientCopyFail, append(asciiOnly([]byte("leafproxy: "+err.Error())), 0))
}

// asciiOnly replaces the bytes of b outside printable ASCII by '?': the server converts a
// CopyFail's message from the client encoding, which may not hold every character.
func asciiOnly(b []byte) []byte {
	for i, c := range b {
		if c < ' ' || c > '~' {
			b[i] = '?'
		}
	}
	return b
}

// copyFailure returns, for the server's error about a CopyFail the proxy sent, the
// proxy's own error that says why: an ID source's SQLSTATE (42704, 55000, 58000) or
// 22P04, rather than the server's 57014.
func (c *conn) copyFailure(body []byte) *refusal {
	ss := &c.sess
	ss.mu.Lock()
	defer ss.mu.Unlock()
	cy := ss.headLocked()
	if cy == nil || cy.copyFailure.msg == nil || !bytes.Equal(errorField(body, fieldCode), []byte(sqlstate.QueryCanceled)) {
		return nil
	}
	r := cy.copyFailure
	cy.copyFailure = refusal{}
	cy.failed = true
	return &r
}

// stripCopyKeys removes the key columns a filled COPY added from its CopyInResponse, so
// that the client sees the columns it listed.
func (c *conn) stripCopyKeys(body []byte) []byte {
	ss := &c.sess
	ss.mu.Lock()
	ci, head := ss.copyIn, ss.headLocked()
	ss.mu.Unlock()
	if ci == nil || ci.cy != head || len(body) < 3 {
		return body
	}
	cols, keys := int(binary.BigEndian.Uint16(body[1:3])), ci.keys
	if cols < keys || len(body) != 3+2*cols {
		return body
	}
	out := append([]byte(nil), body[:3+2*(cols-keys)]...)
	binary.BigEndian.PutUint16(out[1:3], uint16(cols-keys))
	return out
}
