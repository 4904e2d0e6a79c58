//go:build linux

package proxy

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkSocketCalls measures one message sent and received over loopback TCP with the
// calls an event loop makes (sendto and recvfrom, see readNonblock), against read(2)
// and write(2), which it made before: the kernel's cost of the two calls per direction
// of a round trip, the delivery of the segment included.
func BenchmarkSocketCalls(b *testing.B) {
	msg := make([]byte, 64)
	in := make([]byte, readBufferSize)
	b.Run("sendto-recvfrom", func(b *testing.B) {
		from, to := loopbackPair(b)
		for b.Loop() {
			if n, err := writeNonblock(from, msg); n != len(msg) || err != nil {
				b.Fatal(n, err)
			}
			if n, err := readNonblock(to, in); n != len(msg) || err != nil {
				b.Fatal(n, err)
			}
		}
	})
	b.Run("write-read", func(b *testing.B) {
		// The same call with read(2) and write(2), which take no flags: the kernel
		// ignores the arguments past the third.
		from, to := loopbackPair(b)
		for b.Loop() {
			if n, err := socketIO(unix.SYS_WRITE, from, msg, 0); n != len(msg) || err != nil {
				b.Fatal(n, err)
			}
			if n, err := socketIO(unix.SYS_READ, to, in, 0); n != len(msg) || err != nil {
				b.Fatal(n, err)
			}
		}
	})
}

// loopbackPair returns the descriptors of both ends of a loopback TCP connection, blocking
// ones, so that a read waits for the segment the write sent.
func loopbackPair(b *testing.B) (from, to int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	dialed, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	accepted, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	fd := func(c net.Conn) int {
		f, err := c.(*net.TCPConn).File() // a blocking duplicate
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close(); c.Close() })
		return int(f.Fd())
	}
	return fd(dialed), fd(accepted)
}
