package proxy

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/rewrite"
)

// noteParameterStatus follows the session's client_encoding, DateStyle and TimeZone from
// a ParameterStatus body.
func (c *conn) noteParameterStatus(body []byte) { c.server.noteParameterStatus(body) }

// noteParameterStatus follows the server connection's client_encoding, DateStyle and
// TimeZone from a ParameterStatus body.
func (sc *serverConn) noteParameterStatus(body []byte) {
	name, rest, ok := cString(body)
	if !ok {
		return
	}
	value, _, ok := cString(rest)
	if !ok {
		return
	}
	switch name {
	case "client_encoding":
		sc.unsafeEncoding.Store(rewrite.UnsafeCopyEncoding(value))
	case "DateStyle":
		sc.timeParams.iso = strings.HasPrefix(value, "ISO")
	case "TimeZone":
		sc.timeParams.loc = zones.load(value)
	default:
		return
	}
	tf := sc.timeParams
	sc.timeFormat.Store(&tf)
}

// notesParameter reports whether noteParameterStatus acts on the parameter name.
func notesParameter(name string) bool {
	switch name {
	case "client_encoding", "DateStyle", "TimeZone":
		return true
	}
	return false
}

// zones are the time zones the server has reported, loaded once: every session learns
// its TimeZone at startup, and reading the zone database (a file) for each would be a
// good part of what a new connection costs.
var zones = zoneCache{max: 256}

// zoneCache maps the names of time zones to their locations, nil for a name Go does not
// know; it holds max names at most, past which a name is loaded every time (a client can
// set many zones, each spelled many ways).
type zoneCache struct {
	mu   sync.Mutex
	max  int
	locs map[string]*time.Location
}

// load returns the location named name, nil for a zone Go does not know (the server then
// prints the timestamps).
func (z *zoneCache) load(name string) *time.Location {
	z.mu.Lock()
	loc, ok := z.locs[name]
	z.mu.Unlock()
	if ok {
		return loc
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		loc = nil
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.locs == nil {
		z.locs = make(map[string]*time.Location)
	}
	if len(z.locs) < z.max {
		z.locs[name] = loc
	}
	return loc
}

// errUnsafeEncoding refuses a text or CSV COPY that the proxy would fill in an encoding
// whose rows it cannot find.
func errUnsafeEncoding() error {
	return &rewrite.Error{Code: sqlstate.FeatureNotSupported,
		Message: "COPY … FROM STDIN in the text or CSV format whose rows the proxy gives keys is not supported with this client_encoding: its multibyte characters may hold the bytes of line ends, quotes and backslashes",
		Hint:    "Convert the data to UTF8 and SET client_encoding TO 'UTF8' for the COPY, or use COPY … (FORMAT binary)."}
}

// textFiller rewrites a COPY data stream in the text or CSV format, whatever its division
// into CopyData messages, appending to every row one field per key: the delimiter and a
// fresh ID, before the row's line end. It finds the rows as PostgreSQL's COPY FROM does
// (CopyReadLineText): a line ends at the first newline, carriage return or both, by the
// style of the first line; in the text format a backslash takes the next byte as data,
// even a line end, and backslash-period ends the data; in CSV a line end inside a quoted
// field is data, a quote toggles quoting unless escaped, and backslash-period ends the
// data only alone on a line. It never decodes fields: bytes pass through unchanged. It
// holds back only a carriage return or a backslash that ends a message, until the next
// byte tells what it is, and at the start of a CSV line the few bytes that might be the
// end marker.
type textFiller struct {
	csv                  bool
	delim, quote, escape byte
	// escapes is false when the escape character is the quote character, which then
	// simply toggles quoting (a doubled quote toggles twice), as in PostgreSQL.
	escapes bool
	keys    []rewrite.Slot
	nextID  func(rewrite.Slot) (int64, error)
	// header is the field text appended to the header line (the delimiter and the key
	// columns' names for HEADER MATCH, nothing for HEADER); inHeader is set while the
	// first line is being read.
	header   []byte
	inHeader bool

	eol     eolStyle
	lineLen int  // bytes of the current line so far (0: at the start of a line)
	inQuote bool // CSV: inside a quoted field
	lastEsc bool // CSV: the previous byte was an escape inside quotes
	held    []byte
	ended   bool // after the end marker: the rest passes unchanged
	err     error
	special [256]bool // bytes that may end a line or change the state; the rest is skipped
}

type eolStyle uint8

const (
	eolUnknown eolStyle = iota
	eolNL
	eolCR
	eolCRNL
)

// newTextFiller returns the filler of a text or CSV COPY.
func newTextFiller(fill *rewrite.CopyFill, nextID func(rewrite.Slot) (int64, error)) *textFiller {
	f := fill.Format
	t := &textFiller{csv: f.Kind == "csv", delim: f.Delimiter, quote: f.Quote, escape: f.Escape, escapes: f.Escape != f.Quote,
		keys: fill.Keys, nextID: nextID}
	for _, c := range []byte{'\n', '\r', '\\'} {
		t.special[c] = true
	}
	if t.csv {
		t.special[t.quote], t.special[t.escape] = true, true
	}
	switch f.Header {
	case "match":
		t.inHeader = true
		for _, col := range fill.Columns {
			t.header = append(t.header, t.delim)
			t.header = t.appendName(t.header, col)
		}
	case "true":
		t.inHeader = true
	}
	return t
}

// appendName appends a column name as a field of the header line, quoted or escaped so
// that the server reads it back as the name.
func (f *textFiller) appendName(dst []byte, name string) []byte {
	if f.csv {
		dst = append(dst, f.quote)
		for i := 0; i < len(name); i++ {
			if name[i] == f.quote || name[i] == f.escape {
				dst = append(dst, f.escape)
			}
			dst = append(dst, name[i])
		}
		return append(dst, f.quote)
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '\\', f.delim:
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// feed appends to dst the rewritten form of the next bytes of the stream.
func (f *textFiller) feed(dst, in []byte) ([]byte, error) {
	if len(f.held) > 0 {
		// Bytes held back from the previous message go first; they are few.
		in = append(f.held, in...)
		f.held = f.held[:0:0]
	}
	start := 0 // in[start:i] is data not yet copied to dst
	for i := 0; i < len(in) && f.err == nil; i++ {
		if f.ended {
			return append(dst, in[start:]...), nil
		}
		c := in[i]
		if !f.special[c] {
			// A run of plain data: nothing to do but count it.
			j := i + 1
			for j < len(in) && !f.special[in[j]] {
				j++
			}
			f.lineLen += j - i
			f.lastEsc = false
			i = j - 1
			continue
		}
		if f.lineLen == 0 && c == '\\' && f.csv && !f.inQuote {
			// The end marker, if the line is exactly backslash-period.
			switch end, n := f.csvEndMarker(in[i:]); {
			case n < 0: // not known yet: hold the start of the line back
				dst = append(dst, in[start:i]...)
				f.held = append(f.held[:0], in[i:]...)
				return dst, f.err
			case end:
				f.ended = true
				continue
			}
		}
		f.lineLen++
		if f.csv {
			isEsc := f.escapes && c == f.escape
			if f.inQuote && isEsc {
				f.lastEsc = !f.lastEsc
			}
			if c == f.quote && !f.lastEsc {
				f.inQuote = !f.inQuote
			}
			if !isEsc {
				f.lastEsc = false
			}
			if f.inQuote {
				continue
			}
		}
		switch c {
		case '\\':
			if f.csv {
				continue
			}
			if i+1 == len(in) {
				dst = append(dst, in[start:i]...)
				f.held = append(f.held[:0], c)
				f.lineLen--
				return dst, f.err
			}
			if in[i+1] == '.' {
				// End of data; the line before the marker is the last row.
				dst = append(dst, in[start:i]...)
				if f.lineLen > 1 {
					dst = f.appendKeys(dst)
				}
				f.ended = true
				start = i
				continue
			}
			i++ // the next byte is data, whatever it is
			f.lineLen++
		case '\n':
			if f.eol == eolCR || f.eol == eolCRNL {
				continue // the server reports the stray newline
			}
			f.eol = eolNL
			dst = f.endLine(append(dst, in[start:i]...))
			start = i
		case '\r':
			if f.eol == eolNL {
				continue // the server reports the stray carriage return
			}
			if i+1 == len(in) {
				dst = append(dst, in[start:i]...)
				f.held = append(f.held[:0], c)
				f.lineLen--
				return dst, f.err
			}
			if in[i+1] == '\n' {
				f.eol = eolCRNL
			} else if f.eol == eolUnknown {
				f.eol = eolCR
			} else if f.eol == eolCRNL {
				continue // a lone carriage return: the server reports it
			}
			dst = f.endLine(append(dst, in[start:i]...))
			start = i
			if f.eol == eolCRNL {
				i++ // the newline goes with the carriage return
			}
		}
	}
	if f.err != nil {
		return dst, f.err
	}
	return append(dst, in[start:]...), nil
}

// csvEndMarker tells whether b, at the start of a CSV line, begins the end marker
// backslash-period followed by a line end. n < 0: b is too short to tell.
func (f *textFiller) csvEndMarker(b []byte) (end bool, n int) {
	const marker = "\\."
	if len(b) < len(marker)+1 {
		if strings.HasPrefix(marker+"\r", string(b)) || strings.HasPrefix(marker+"\n", string(b)) {
			return false, -1
		}
		return false, 0
	}
	return string(b[:2]) == marker && (b[2] == '\n' || b[2] == '\r'), 3
}

// endLine appends what ends a row before its line end: the keys, or on the header line
// the header's fields.
func (f *textFiller) endLine(dst []byte) []byte {
	if f.inHeader {
		f.inHeader = false
		dst = append(dst, f.header...)
	} else {
		dst = f.appendKeys(dst)
	}
	f.lineLen = 0
	return dst
}

// appendKeys appends one field per key: the delimiter and a fresh ID.
func (f *textFiller) appendKeys(dst []byte) []byte {
	for _, k := range f.keys {
		id, err := f.nextID(k)
		if err != nil {
			f.err = err
			return dst
		}
		dst = append(dst, f.delim)
		dst = strconv.AppendInt(dst, id, 10)
	}
	return dst
}

// finish appends what the end of the stream (CopyDone) completes: a last row without a
// line end gets its keys, and a held carriage return ends its row, as at the server.
func (f *textFiller) finish(dst []byte) ([]byte, error) {
	if f.ended || f.err != nil {
		return append(dst, f.held...), f.err
	}
	held := f.held
	f.held = nil
	if len(held) == 1 && held[0] == '\r' {
		dst = f.endLine(dst)
		return append(dst, '\r'), f.err
	}
	if len(held) > 0 {
		// A partial end marker or a lone backslash: data of the last line.
		dst = append(dst, held...)
		f.lineLen += len(held)
	}
	if f.lineLen > 0 {
		dst = f.endLine(dst)
	}
	return dst, f.err
}
