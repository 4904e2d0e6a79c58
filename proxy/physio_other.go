//go:build !linux

package proxy

import "time"

// physIO exists only where event loops do (physio_linux.go).
type physIO struct{ onLoop bool }

func (p *physConn) loopNative() error { return nil }

func (*physIO) Close() error                { return nil }
func (*physIO) SetDeadline(time.Time) error { return nil }
