package proxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
)

// A header that announces a huge body must not make the reader set the whole body aside
// before the bytes come: memory has to follow what arrived.
func TestReadBodyGrowsWithArrivingBytes(t *testing.T) {
	const announced = 128 << 20
	msg := []byte{'Q', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], announced+4)
	msg = append(msg, "select 1; --"...)
	r := &msgReader{br: bufio.NewReaderSize(bytes.NewReader(msg), readBufferSize), maxBody: defaultMaxBodySize}

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	typ, n, err := r.next()
	if err != nil || typ != 'Q' || n != announced {
		t.Fatalf("next() = %q, %d, %v", typ, n, err)
	}
	_, err = r.readBody(n)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("readBody of a truncated message: %v, want unexpected EOF", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("reading 12 bytes of a message announced as %d bytes allocated %d bytes", announced, grew)
	}
}

func TestReadBodyLargeComplete(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef"), 100_000) // 1.6 MB, several doublings
	msg := []byte{'Q', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)+4))
	msg = append(msg, body...)
	r := &msgReader{br: bufio.NewReaderSize(chunked(msg), readBufferSize), maxBody: defaultMaxBodySize}
	_, n, err := r.next()
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.readBody(n)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("readBody: %d bytes, %v; want the %d-byte body", len(got), err, len(body))
	}
}

// chunked returns a reader that hands out at most 1000 bytes per Read, as a slow
// network would.
func chunked(b []byte) io.Reader { return &chunkReader{b: b} }

type chunkReader struct{ b []byte }

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), 1000)], c.b)
	c.b = c.b[n:]
	return n, nil
}
