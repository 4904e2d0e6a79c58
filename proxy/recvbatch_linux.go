//go:build linux && (amd64 || arm64)

package proxy

import (
	"bytes"

	"github.com/leafproxy/leafproxy/internal/uring"
	"golang.org/x/sys/unix"
)

// recvSlot is the most a batched receive takes from one socket. A socket that fills it
// may hold more, which its session reads on from the socket itself.
const recvSlot = 4 << 10

// recvBatchKeep is the most memory the batch keeps between two turns.
const recvBatchKeep = 64 << 10

// A recvBatch receives from the sockets an epoll wait reported readable in one system
// call over the loop's io_uring (the send batch's ring), instead of one recvfrom each
// from their sessions. It is the receiving half of sendBatch: a turn with several ready
// sessions pays for one call to read them and one to answer them.
//
// What a socket gave goes to its side's endReader (loopEnd.in.held), which the session's
// reader reads before the socket: the order of the stream is kept, and everything that
// looks at a side's input (mayHaveInput, a hand-off's carry-over, the quiet test) sees
// the bytes there. They are in the batch's memory until the turn ends; release gives any
// left unread a memory of their own before the next batch reuses it.
//
// Only a socket whose session will read it this turn is batched: a plain socket (TLS
// reads through its record layer) of a live session that may read it, reported readable
// and nothing else, with nothing held already. Everything else reads as before.
type recvBatch struct {
	sends *sendBatch // the batch whose ring this one shares
	arena []byte     // recvSlot bytes for each socket received from, in the order of ends
	ends  []*loopEnd // the sockets received from this turn
	got   []bool     // by the index in ends: whether its receive has completed
	// failed is set when the ring failed in a way that may leave a receive unfinished:
	// its memory is then never reused, nor the batch.
	failed bool
}

// newRecvBatch returns the receive batch over sends' ring; nil without sends.
func newRecvBatch(sends *sendBatch) *recvBatch {
	if sends == nil {
		return nil
	}
	return &recvBatch{sends: sends}
}

// receive reads the sockets of events that its sessions will read, when there are two or
// more, and clears their EPOLLIN: their sessions find the bytes held, their sockets
// marked readable only when a receive filled its slot.
func (b *recvBatch) receive(l *eventLoop, events []unix.EpollEvent) {
	if b.prepare(l, events) {
		b.collect()
	}
}

// prepare prepares the receives of the sockets of events that their sessions will read,
// when there are two or more (one costs a call either way), and reports whether it did.
func (b *recvBatch) prepare(l *eventLoop, events []unix.EpollEvent) bool {
	if b == nil || b.failed || b.sends.failed || len(b.ends) > 0 {
		return false
	}
	picked := 0
	for i := range events {
		if l.batchable(&events[i]) != nil {
			picked++
		}
	}
	if picked = min(picked, b.sends.ring.Free()); picked < 2 {
		return false
	}
	if cap(b.arena) < picked*recvSlot {
		b.arena = make([]byte, picked*recvSlot)
	}
	for i := range events {
		end := l.batchable(&events[i])
		if end == nil {
			continue
		}
		k := len(b.ends)
		if k == picked || b.sends.ring.PrepRecvNow(end.fd, b.slot(k), 0, uint64(k)) != nil {
			break // the rest read as before
		}
		b.ends, b.got = append(b.ends, end), append(b.got, false)
		events[i].Events &^= unix.EPOLLIN
	}
	return len(b.ends) > 0
}

// collect submits the prepared receives and takes their completions.
func (b *recvBatch) collect() {
	if _, err := b.sends.ring.Enter(0, 0); err != nil {
		b.fail(nil)
		return
	}
	for done := b.reap(); done < len(b.ends); done += b.reap() {
		// Not expected: a receive with MSG_DONTWAIT completes while it is submitted
		// (see package uring). Its memory must not be reused before it has.
		if _, err := b.sends.ring.Enter(uint32(len(b.ends)-done), -1); err != nil {
			b.fail(err)
			return
		}
	}
}

// fail ends the turn's receives that have not completed, the ring having failed: neither
// batch uses it again, as the receives it holds unsubmitted would go with its next call,
// into memory reused by then. With err nil they were not submitted, and their sessions
// read their sockets as without the batch; else they were, and may still take bytes from
// their sockets: the sessions end, with err for the side's error, for want of knowing
// what their streams hold.
func (b *recvBatch) fail(err error) {
	b.failed, b.sends.failed = true, true
	for k, end := range b.ends {
		if b.got[k] {
			continue
		}
		if err == nil {
			end.src.readable = true
		} else {
			end.sink.err = err
			end.ls.queueAgain()
		}
	}
}

// slot is the memory of the k-th receive of a turn.
func (b *recvBatch) slot(k int) []byte {
	return b.arena[k*recvSlot : (k+1)*recvSlot]
}

// reap takes the completions of the turn's receives in the ring and reports how many.
func (b *recvBatch) reap() int {
	first, second := b.sends.ring.Completions()
	for _, part := range [2][]uring.CQE{first, second} {
		for _, cqe := range part {
			b.complete(cqe)
		}
	}
	n := len(first) + len(second)
	b.sends.ring.Consume(n)
	return n
}

// complete hands the bytes of a receive to its socket's session.
func (b *recvBatch) complete(cqe uring.CQE) {
	k := int(cqe.UserData)
	end := b.ends[k]
	switch res := int(cqe.Res); {
	case res > 0:
		end.in.held = b.slot(k)[:res]
		end.src.readable = res == recvSlot // a full slot: the socket may hold more
	case res == -int(unix.EAGAIN):
		end.src.readable = false
	default:
		end.src.readable = true // an end or an error: the session's read meets it
	}
	b.got[k] = true
}

// release ends the turn's batch: bytes a session left unread get memory of their own, and
// the session another turn to read them, since its socket may not be reported again.
func (b *recvBatch) release() {
	if b == nil || len(b.ends) == 0 {
		return
	}
	for _, end := range b.ends {
		if len(end.in.held) == 0 {
			continue
		}
		end.in.held = bytes.Clone(end.in.held)
		if ls := end.ls; !ls.dead && !ls.detached && end.slot != 0 {
			ls.queueAgain()
		}
	}
	clear(b.ends)
	b.ends, b.got = b.ends[:0], b.got[:0]
	if cap(b.arena) > recvBatchKeep && !b.failed {
		b.arena = nil
	}
}

// batchable returns the side of a loop session that ev reports readable, when the receive
// batch may read it for the session (see recvBatch), else nil.
func (l *eventLoop) batchable(ev *unix.EpollEvent) *loopEnd {
	if ev.Events != unix.EPOLLIN || loopToken(ev.Pad) == wakeToken {
		return nil
	}
	end := l.ends[ev.Fd]
	if end == nil || end.token != loopToken(ev.Pad) || end.ls == nil || end.tls != nil || end.pio != nil || len(end.in.held) > 0 {
		return nil
	}
	ls := end.ls
	if ls.dead || ls.detached || ls.finishing || (ls.tx != nil && end == &ls.upstream) || !ls.mayRead(end) {
		return nil
	}
	return end
}
