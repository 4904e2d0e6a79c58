package proxy

import (
	"encoding/binary"
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

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
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
		f.mu.Unlock()
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
	b.Send(&pgproto3.AuthenticationOk{})
	for _, p := range startupParameters {
		b.Send(&pgproto3.ParameterStatus{Name: p[0], Value: p[1]})
	}
	b.Send(&pgproto3.BackendKeyData{ProcessID: 4242, SecretKey: binary.BigEndian.AppendUint32(nil, 1)})
	b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	return b.Flush()
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
