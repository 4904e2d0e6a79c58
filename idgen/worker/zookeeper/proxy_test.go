package zookeeper_test

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// cutProxy forwards TCP connections to a server until it is cut: then it drops every
// connection and refuses new ones, so the server hears nothing from the client (and
// expires its session) while both processes keep running.
//
// It can also swallow requests: with swallow set to an opcode, it reads the client's
// frames and drops those requests, forwarding everything else (pings too), so the client
// waits for an answer on a connection that otherwise looks healthy.
type cutProxy struct {
	ln     net.Listener
	target string

	swallow   atomic.Int32 // opcode of the requests to drop; 0 for none
	swallowed atomic.Int32 // requests dropped so far

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

// opSetData is ZooKeeper's opcode of Set.
const opSetData = 5

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
	})
	go p.serve()
	return p
}

func (p *cutProxy) Addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *cutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	for _, c := range cs {
		p.conns[c] = true
	}
	return true
}

func (p *cutProxy) forward(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		client.Close()
		server.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go func() {
		p.forwardRequests(server, client)
		server.Close()
		client.Close()
		done <- struct{}{}
	}()
	go pipe(client, server)
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}

// forwardRequests copies the client's frames to the server, less the swallowed ones. The
// first frame is the connect request; each later one starts with xid and opcode.
func (p *cutProxy) forwardRequests(server, client net.Conn) {
	r := bufio.NewReader(client)
	for first := true; ; first = false {
		var size [4]byte
		if _, err := io.ReadFull(r, size[:]); err != nil {
			return
		}
		frame := make([]byte, 4+binary.BigEndian.Uint32(size[:]))
		copy(frame, size[:])
		if _, err := io.ReadFull(r, frame[4:]); err != nil {
			return
		}
		if op := p.swallow.Load(); !first && op != 0 && len(frame) >= 12 &&
			int32(binary.BigEndian.Uint32(frame[8:12])) == op {
			p.swallowed.Add(1)
			continue
		}
		if _, err := server.Write(frame); err != nil {
			return
		}
	}
}

// setCut cuts (true) or restores (false) the link.
func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
	}
}
