//go:build !unix

package proxy

import "net"

// socketQuiet cannot look at the socket here: a server connection that was idle is
// not trusted with another session.
func socketQuiet(net.Conn) bool { return false }

// socketClosed cannot look at the socket here: a client waiting for a server connection
// is taken to be there until its wait ends.
func socketClosed(net.Conn) bool { return false }
