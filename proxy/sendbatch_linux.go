//go:build linux && (amd64 || arm64)

package proxy

import (
	"math"
	"syscall"

	"github.com/leafproxy/leafproxy/internal/uring"
	"golang.org/x/sys/unix"
)

// sendBatchEntries is the size of an event loop's send ring: how many sockets one call
// sends to at most (a turn with more makes more calls).
const sendBatchEntries = 256

// sendBatchKeep is the most memory the batch's bytes keep between two turns.
const sendBatchKeep = 64 << 10

// A sendBatch holds the last writes of the sessions an event loop served in one turn (the
// run process leaves to go out last, see loopSession.out), to send them all in one
// system call at the end of the turn over an io_uring, instead of one sendto each. On a
// virtual machine a system call is about as dear as the work it does for a small
// message; a turn with several ready sessions saves all but one.
//
// The bytes are copied into the batch, so that the session's buffers are free at once. A
// socket's deferred bytes go before anything else written to it: every write to an
// fdSink sends them first, synchronously, and so does taking the socket out of the loop
// (eventLoop.remove), before it is closed or changes hands. A send the socket does not
// take in full leaves the rest pending, as a short sendto does, and the session settles
// again around it; one that fails leaves its error, which the session acts on.
type sendBatch struct {
	ring  *uring.Ring
	bytes []byte     // the deferred bytes of every socket in ends, back to back
	ends  []*loopEnd // the sockets with deferred bytes, in the order they came
	// inflight holds where the bytes of each send submitted are, by its index in the
	// chunk of ends submitted.
	inflight [sendBatchEntries]deferredSend
	// failed is set when the ring failed in a way that leaves it unusable; the loop
	// then sends each write at once.
	failed bool
}

// SendBatchSupport reports why the event loops cannot send their writes in batches over
// io_uring here (see Server.PlainSends), or nil when they can.
func SendBatchSupport() error {
	ring, err := uring.NewSender(1)
	if err != nil {
		return err
	}
	return ring.Close()
}

// newSendBatch returns a batch, or nil when the kernel has no io_uring for it (the loop
// then sends each write at once).
func newSendBatch() *sendBatch {
	ring, err := uring.NewSender(sendBatchEntries)
	if err != nil {
		return nil
	}
	return &sendBatch{ring: ring}
}

// due reports whether the batch holds bytes to send.
func (b *sendBatch) due() bool { return b != nil && len(b.ends) > 0 }

// close releases the batch's ring.
func (b *sendBatch) close() {
	if b != nil {
		b.ring.Close()
	}
}

// deferSend queues p, the last output of a turn for end's plain socket, for the end of
// the turn. It reports false, queuing nothing, with no batch or when the socket has
// output pending or an error: p is then for the caller to write.
func (b *sendBatch) deferSend(end *loopEnd, p []byte) bool {
	s := &end.sink
	if b == nil || b.failed || len(s.pending) > 0 || s.err != nil {
		return false
	}
	d := &s.deferred
	if d.n > 0 && int(d.off+d.n) != len(b.bytes) {
		s.sendDeferred() // not at the batch's end: the two could not go out in one piece
	}
	if len(b.bytes)+len(p) > math.MaxInt32 {
		return false
	}
	if d.n == 0 {
		d.off = int32(len(b.bytes))
	}
	b.bytes = append(b.bytes, p...)
	d.n += int32(len(p))
	if d.batch == nil {
		d.batch = b
		b.ends = append(b.ends, end)
	}
	return true
}

// send sends what the batch holds. A session a send left with output pending or an error
// gets another turn (loopSession.queueAgain), in which it settles around it.
func (b *sendBatch) send() {
	for start := 0; start < len(b.ends); start += sendBatchEntries {
		chunk := b.ends[start:min(start+sendBatchEntries, len(b.ends))]
		prepared := 0
		for i, end := range chunk {
			d, in := &end.sink.deferred, &b.inflight[i]
			*in = *d
			if in.n == 0 {
				continue // sent meanwhile, by a write to the socket
			}
			d.n = 0 // taken: the bytes go once, whatever the list holds
			prepared++
			if !b.failed && b.ring.PrepSend(end.sink.fd, b.bytes[in.off:in.off+in.n], unix.MSG_NOSIGNAL, uint64(i)) != nil {
				b.failed = true // cannot happen: the ring has room for sendBatchEntries
			}
		}
		switch {
		case b.failed:
			b.sendEach(chunk) // the ring failed, in this turn's batch or an earlier chunk
		case prepared > 0:
			b.submit(chunk, prepared)
		}
		for _, end := range chunk {
			end.sink.deferred = deferredSend{}
		}
	}
	clear(b.ends)
	b.ends = b.ends[:0]
	if cap(b.bytes) > sendBatchKeep {
		b.bytes = nil
	}
	b.bytes = b.bytes[:0]
}

// submit submits the prepared sends of chunk and takes their completions. Should the
// ring fail to take them, they go one by one; should it fail after, the sockets whose
// sends it has not reported fail: whether their bytes went is unknown.
func (b *sendBatch) submit(chunk []*loopEnd, prepared int) {
	if _, err := b.ring.Enter(0, 0); err != nil {
		// The sends stay in the ring, which the next call would submit again: the ring
		// is not used again.
		b.failed = true
		b.sendEach(chunk)
		return
	}
	for reaped := b.reap(chunk); reaped < prepared; reaped += b.reap(chunk) {
		// Not expected: a send with MSG_DONTWAIT completes while it is submitted
		// (see package uring). Its bytes must not be reused before it has.
		if _, err := b.ring.Enter(uint32(prepared-reaped), -1); err != nil {
			b.failed = true
			for i, end := range chunk {
				if b.inflight[i].n > 0 {
					b.inflight[i].n = 0
					end.sink.err = err
					end.ls.queueAgain()
				}
			}
			return
		}
	}
}

// reap takes the completions in the ring, of sends submitted for chunk, and reports how
// many: a short send leaves the rest pending, a failed one its error.
func (b *sendBatch) reap(chunk []*loopEnd) int {
	first, second := b.ring.Completions()
	for _, part := range [2][]uring.CQE{first, second} {
		for _, cqe := range part {
			end, d := chunk[cqe.UserData], &b.inflight[cqe.UserData]
			s := &end.sink
			switch res := int(cqe.Res); {
			case res >= int(d.n):
				d.n = 0
				continue
			case res >= 0:
				s.pending = append(s.pending, b.bytes[int(d.off)+res:d.off+d.n]...)
			case res == -int(unix.EAGAIN) || res == -int(unix.EINTR):
				s.pending = append(s.pending, b.bytes[d.off:d.off+d.n]...)
			default:
				s.err = syscall.Errno(-res)
			}
			d.n = 0
			end.ls.queueAgain()
		}
	}
	n := len(first) + len(second)
	b.ring.Consume(n)
	return n
}

// sendEach sends the prepared sends of chunk one by one, the ring having failed to take
// them.
func (b *sendBatch) sendEach(chunk []*loopEnd) {
	for i, end := range chunk {
		d := &b.inflight[i]
		if d.n == 0 {
			continue
		}
		s := &end.sink
		s.writeOrKeep(b.bytes[d.off : d.off+d.n])
		d.n = 0
		if len(s.pending) > 0 || s.err != nil {
			end.ls.queueAgain()
		}
	}
}

// deferredSend is where an fdSink's deferred bytes are in its loop's sendBatch: batch is
// set while the socket is in the batch's ends, n is 0 once they have gone.
type deferredSend struct {
	batch  *sendBatch
	off, n int32
}

// sendDeferred writes the sink's deferred bytes now, ahead of anything else.
func (s *fdSink) sendDeferred() {
	if s.deferred.n == 0 || s.err != nil {
		return
	}
	d := &s.deferred
	p := d.batch.bytes[d.off : d.off+d.n]
	d.n = 0
	s.writeOrKeep(p)
}
