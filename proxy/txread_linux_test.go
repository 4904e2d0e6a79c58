//go:build linux

package proxy

import (
	"bufio"
	"context"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/proxy/pool"
)

// TestReadServerLeavesGivenBackConnection: a ReadyForQuery whose last byte comes in a
// later read is gathered, and handling it gives the borrowed connection back, after which
// another session (of another loop) may read it at once: readServer must not touch the
// connection's reader again. The test's host takes the reader away as the connection goes
// back, so that any later use of it fails.
func TestReadServerLeavesGivenBackConnection(t *testing.T) {
	rfq := []byte{serverReadyForQuery, 0, 0, 0, 5, txIdle}
	pc := &physConn{br: bufio.NewReader(&piecesReader{pieces: [][]byte{rfq[:5], nil, rfq[5:]}})}
	p, err := pool.New[*physConn](onePhysConn{pc}, pool.Settings{Limits: pool.Limits{PoolSize: 1}, Log: logrus.New()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	key := pool.Key{Database: "db", User: "user"}
	srv, err := p.Acquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	v := newPooledConn(&conn{srv: &Server{}}, key)
	host := &givingBackHost{}
	v.host = host
	v.srv, v.pc, v.readerOn = srv, pc, true
	v.push(expect{kind: expSync})
	v.outstanding = 1

	out := make([]byte, readBufferSize)
	v.mu.Lock()
	defer v.mu.Unlock()
	if n, err := v.readServer(pc, out, true); n != 0 || !isWouldBlock(err) {
		t.Fatalf("first read: %d bytes, %v; want the header gathered and errWouldBlock", n, err)
	}
	n, err := v.readServer(pc, out, true)
	if err != nil || string(out[:n]) != string(rfq) {
		t.Fatalf("second read: %q, %v; want the ReadyForQuery", out[:n], err)
	}
	if !host.released || v.pc != nil {
		t.Fatalf("the connection was not given back (released %v)", host.released)
	}
}

// piecesReader reads its pieces one per Read; a nil piece reads as a socket with nothing
// to read yet.
type piecesReader struct{ pieces [][]byte }

func (r *piecesReader) Read(b []byte) (int, error) {
	if len(r.pieces) == 0 {
		return 0, errWouldBlock
	}
	piece := r.pieces[0]
	r.pieces = r.pieces[1:]
	if piece == nil {
		return 0, errWouldBlock
	}
	return copy(b, piece), nil
}

// onePhysConn is a pool.Connector that lends one given connection.
type onePhysConn struct{ pc *physConn }

func (c onePhysConn) Dial(context.Context, pool.Key) (*physConn, error) { return c.pc, nil }
func (onePhysConn) Reset(context.Context, *physConn) error              { return nil }
func (onePhysConn) Close(*physConn)                                     {}

// givingBackHost is a txHost that gives connections back to the pool and, as another
// loop's session might, takes the connection's reader at once.
type givingBackHost struct{ released bool }

func (h *givingBackHost) post(f func()) bool { f(); return true }
func (h *givingBackHost) dropServer(bool)    {}
func (h *givingBackHost) resume()            {}
func (h *givingBackHost) release(srv *pool.Server[*physConn], st pool.State) {
	srv.Conn().br = nil
	h.released = true
	srv.Release(st)
}
