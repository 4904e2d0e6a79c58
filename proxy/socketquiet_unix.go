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
	nc, _ = socketUnder(nc)
	if q, ok := nc.(interface{ quiet() bool }); ok {
		return q.quiet() // a socket of the proxy's own (fdConn)
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	quiet := false
	err = rc.Read(func(fd uintptr) bool {
		quiet = peekQuiet(int(fd))
		return true
	})
	return err == nil && quiet
}

// peekQuiet reports whether nothing can be read from the socket fd now, without reading.
func peekQuiet(fd int) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(fd, b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return errors.Is(err, syscall.EAGAIN)
}

// socketClosed reports whether the peer of nc, a client that sends nothing while it
// waits, has closed the socket under nc or reset it; the socket is only peeked at.
func socketClosed(nc net.Conn) bool {
	nc, _ = socketUnder(nc)
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = err == nil && n == 0 || err != nil && !errors.Is(err, syscall.EAGAIN)
		return true
	})
	return err == nil && closed
}
