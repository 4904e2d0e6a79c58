//go:build unix

package proxy

import (
	"errors"
	"net"
	"syscall"
)

// socketQuiet reports whether nothing can be read from the socket under nc, a server
// connection nobody has used for a while: no byte arrived and the server did not hang
// up. The socket is only peeked at.
func socketQuiet(nc net.Conn) bool {
	under, _ := socketUnder(nc)
	if q, ok := under.(interface{ quiet() bool }); ok {
		return q.quiet() // a socket of the proxy's own (fdConn)
	}
	return peekSocket(under) == peekNothing
}

// socketClosed reports whether the peer of nc, a client that sends nothing while it
// waits, has closed the socket under nc or reset it; the socket is only peeked at.
func socketClosed(nc net.Conn) bool {
	under, _ := socketUnder(nc)
	return peekSocket(under) == peekClosed
}

// peekResult is what a peek at a socket found.
type peekResult int

const (
	peekUnknown peekResult = iota // the socket could not be looked at
	peekNothing                   // nothing to read, and the peer has not hung up
	peekData                      // bytes wait to be read
	peekClosed                    // the peer closed or reset the connection
)

// peekSocket peeks at the socket of nc, a connection of the runtime's, without reading.
func peekSocket(nc net.Conn) peekResult {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return peekUnknown
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return peekUnknown
	}
	found := peekUnknown
	if err := rc.Read(func(fd uintptr) bool {
		found = peekFD(int(fd))
		return true
	}); err != nil {
		return peekUnknown
	}
	return found
}

// peekQuiet reports whether nothing can be read from the socket fd now, without reading.
func peekQuiet(fd int) bool { return peekFD(fd) == peekNothing }

// peekFD peeks at the socket fd without reading from it or blocking.
func peekFD(fd int) peekResult {
	var b [1]byte
	n, _, err := syscall.Recvfrom(fd, b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case errors.Is(err, syscall.EAGAIN):
		return peekNothing
	case err != nil || n == 0:
		return peekClosed
	default:
		return peekData
	}
}
