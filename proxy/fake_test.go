package proxy

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// fakeUpstream is a minimal PostgreSQL server for tests that must control the upstream or
// leave it out of a measurement: it trusts everyone, sends the startup messages PostgreSQL
// sends, and answers every Query and Sync with ReadyForQuery.
type fakeUpstream struct {
	l net.Listener
	// hold, when set, keeps connections open after startup without reading from them, so
	// that the fake spends no goroutine per connection.
	hold bool

	mu     sync.Mutex
	conns  []net.Conn
	script []byte // see setScript
	wg     sync.WaitGroup
}

// setScript makes the connections accepted from now on answer with script instead of as
// PostgreSQL would (nil restores that). A script is what a fuzzer makes of a server:
//
//	script = flags chunk*
//	chunk  = length(1 byte) bytes(length; fewer when the script ends first)
//
// With flag bit 0 the first chunk is the whole answer to the startup message (an
// authentication request, an error, garbage); otherwise the fake sends PostgreSQL's
// startup answers itself. After startup every message the proxy sends gets the next
// chunk as its answer, whatever the message was. When the chunks are used up the fake
// shuts its side of the connection and reads until the proxy closes it.
func (f *fakeUpstream) setScript(script []byte) {
	f.mu.Lock()
	f.script = script
	f.mu.Unlock()
}

func startFakeUpstream(t testing.TB, hold bool) *fakeUpstream {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeUpstream{l: l, hold: hold}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *fakeUpstream) addr() string { return f.l.Addr().String() }

func (f *fakeUpstream) close() {
	f.l.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fakeUpstream) accept() {
	defer f.wg.Done()
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		script := f.script
		f.mu.Unlock()
		if len(script) > 0 {
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer c.Close()
				serveScript(c, script)
			}()
			continue
		}
		if f.hold {
			// Sequential startup keeps the fake free of per-connection goroutines.
			if f.startup(pgproto3.NewBackend(c, c)) != nil {
				c.Close()
			}
			continue
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			f.serve(c)
		}()
	}
}

// startupParameters are the ParameterStatus messages PostgreSQL 15 sends.
var startupParameters = [][2]string{
	{"application_name", ""}, {"client_encoding", "UTF8"}, {"DateStyle", "ISO, MDY"},
	{"default_transaction_read_only", "off"}, {"in_hot_standby", "off"},
	{"integer_datetimes", "on"}, {"IntervalStyle", "postgres"}, {"is_superuser", "on"},
	{"server_encoding", "UTF8"}, {"server_version", "15.0"},
	{"session_authorization", "postgres"}, {"standard_conforming_strings", "on"},
	{"TimeZone", "UTC"},
}

func (f *fakeUpstream) startup(b *pgproto3.Backend) error {
	for {
		msg, err := b.ReceiveStartupMessage()
		if err != nil {
			return err
		}
		switch msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			continue // the proxy never sends these with sslmode=disable
		case *pgproto3.StartupMessage:
		default:
			return net.ErrClosed
		}
		break
	}
	sendStartupAnswers(b)
	return b.Flush()
}

// sendStartupAnswers queues what PostgreSQL answers a StartupMessage that needs no password.
func sendStartupAnswers(b *pgproto3.Backend) {
	b.Send(&pgproto3.AuthenticationOk{})
	for _, p := range startupParameters {
		b.Send(&pgproto3.ParameterStatus{Name: p[0], Value: p[1]})
	}
	b.Send(&pgproto3.BackendKeyData{ProcessID: 4242, SecretKey: binary.BigEndian.AppendUint32(nil, 1)})
	b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
}

func (f *fakeUpstream) serve(c net.Conn) {
	b := pgproto3.NewBackend(c, c)
	if f.startup(b) != nil {
		return
	}
	for {
		msg, err := b.Receive()
		if err != nil {
			return
		}
		switch msg.(type) {
		case *pgproto3.Query:
			b.Send(&pgproto3.EmptyQueryResponse{})
			b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		case *pgproto3.Sync:
			b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		case *pgproto3.Terminate:
			return
		default:
			continue
		}
		if b.Flush() != nil {
			return
		}
	}
}

// serveScript answers one connection from the proxy with a script (see setScript).
func serveScript(c net.Conn, script []byte) {
	flags, chunks := script[0], script[1:]
	next := func() []byte {
		if len(chunks) == 0 {
			return nil
		}
		n := min(int(chunks[0]), len(chunks)-1)
		chunk := chunks[1 : 1+n]
		chunks = chunks[1+n:]
		return chunk
	}
	r := bufio.NewReader(c)
	if !readStartup(c, r) {
		return
	}
	if flags&1 != 0 {
		if _, err := c.Write(next()); err != nil {
			return
		}
	} else {
		b := pgproto3.NewBackend(r, c)
		sendStartupAnswers(b)
		if b.Flush() != nil {
			return
		}
	}
	for len(chunks) > 0 {
		if !readMessage(r) {
			return
		}
		if _, err := c.Write(next()); err != nil {
			return
		}
	}
	_ = c.(*net.TCPConn).CloseWrite()
	_, _ = io.Copy(io.Discard, r)
}

// readStartup reads startup packets up to the StartupMessage, refusing encryption. It
// reports false when the connection ends or sends something else (a CancelRequest).
func readStartup(c net.Conn, r *bufio.Reader) bool {
	for {
		var head [8]byte
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return false
		}
		n := int(binary.BigEndian.Uint32(head[:4]))
		if n < 8 || n > 10000 {
			return false
		}
		if _, err := r.Discard(n - 8); err != nil {
			return false
		}
		switch binary.BigEndian.Uint32(head[4:]) {
		case sslRequestCode, gssEncRequestCode:
			if _, err := c.Write([]byte{'N'}); err != nil {
				return false
			}
		case cancelRequestCode:
			return false
		default:
			return true
		}
	}
}

// readMessage reads one message of the proxy's, whatever its type, and reports whether
// there was a whole one.
func readMessage(r *bufio.Reader) bool {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return false
	}
	n := int(binary.BigEndian.Uint32(head[1:]))
	if n < 4 {
		return false
	}
	_, err := r.Discard(n - 4)
	return err == nil
}
