//go:build linux && !(amd64 || arm64)

package proxy

import (
	"errors"

	"golang.org/x/sys/unix"
)

// SendBatchSupport reports why the event loops cannot send their writes in batches over
// io_uring here: package uring's layouts are those of amd64 and arm64.
func SendBatchSupport() error {
	return errors.New("io_uring sends need Linux on amd64 or arm64")
}

// Without package uring (its layouts are those of amd64 and arm64), an event loop sends
// each write at once.

type sendBatch struct{}

type deferredSend struct{ n int32 }

func newSendBatch() *sendBatch { return nil }

func (*sendBatch) due() bool { return false }
func (*sendBatch) send()     {}
func (*sendBatch) close()    {}

func (*sendBatch) deferSend(*loopEnd, []byte) bool { return false }

func (*fdSink) sendDeferred() {}

type recvBatch struct{}

func newRecvBatch(*sendBatch) *recvBatch { return nil }

func (*recvBatch) receive(*eventLoop, []unix.EpollEvent) {}
func (*recvBatch) release()                              {}
