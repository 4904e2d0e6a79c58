//go:build linux

package proxy

import (
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// An event loop serves many sessions from one goroutine: it waits on an epoll set that
// holds the sockets of its sessions, reads what has arrived, runs the same message
// handlers as the goroutine relay over it, and writes the results without blocking.
// Compared with two goroutines per session it saves, per round trip, the reads that find
// no data and the scheduler's park and wake-up of both goroutines. That is the proxy's
// main cost, since PostgreSQL's messages are small.
//
// The loop's epoll set is level-triggered: a socket is read once per readiness, and a
// side that may not be read (its output is backed up) is taken out of the set until the
// output has drained.

// loopToken identifies a socket in an event loop's epoll set. Tokens are never reused
// within a loop, so an event for a socket closed meanwhile finds nothing. An event
// carries the token and the socket's slot in the loop's table of sockets (loopEnd.slot),
// so that finding the socket of an event is an index, not a map lookup.
type loopToken = uint32

// wakeToken is the token of the loop's own eventfd, written to when work is posted; its
// slot is 0, which no socket has.
const wakeToken loopToken = 0

// loopYieldTurns is how many turns of a busy loop go by between two looks at the clock
// (see loopYieldEvery).
const loopYieldTurns = 16

// loopYieldEvery is how often a busy loop lets the scheduler run something else; well
// under the runtime's 10 ms preemption threshold.
const loopYieldEvery = 5 * time.Millisecond

// loopIdleWait is how often a loop with a pending deadline looks at its clock.
const loopIdleWait = 100 * time.Millisecond

// loopLinger is how long a loop whose last session has ended waits for the next one
// before it stops.
const loopLinger = time.Second

// loopGroup is a server's set of event loops (Server.EventLoops of them at most). A loop
// starts with its first session. When its last session ends it waits loopLinger for the
// next one before it stops, so that a client that connects for every request does not
// pay for starting and ending a loop each time; a second idle loop stops at once, and
// close stops the idle one. An idle server thus holds no loop after a second.
type loopGroup struct {
	mu     sync.Mutex
	loops  []*eventLoop // nil where no loop runs
	closed bool         // the server is closed: loops stop with their last session
}

// assign picks the loop for a new session among n: an idle running loop first, then a
// free slot, where it starts one, then the loop with the fewest sessions. A loop started
// with plainSends sends each write at once, with no sendBatch.
func (g *loopGroup) assign(n int, plainSends bool) (*eventLoop, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.loops == nil {
		g.loops = make([]*eventLoop, n)
	}
	idle, free, least := -1, -1, -1
	for i, l := range g.loops {
		switch {
		case l == nil:
			if free < 0 {
				free = i
			}
		case l.sessions == 0:
			if idle < 0 {
				idle = i
			}
		case least < 0 || l.sessions < g.loops[least].sessions:
			least = i
		}
	}
	best := least
	if idle >= 0 {
		best = idle
	} else if free >= 0 {
		best = free
	}
	l := g.loops[best]
	if l == nil {
		var err error
		if l, err = newEventLoop(g, best, plainSends); err != nil {
			return nil, err
		}
		g.loops[best] = l
		go l.run()
	}
	l.sessions++
	l.idle.Store(false)
	return l, nil
}

// running counts the loops that run.
func (g *loopGroup) running() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, l := range g.loops {
		if l != nil {
			n++
		}
	}
	return n
}

// release gives back a session's place in l. When it was the last, l stops, or waits
// loopLinger for the next session when no other loop is idle.
func (g *loopGroup) release(l *eventLoop) {
	g.mu.Lock()
	defer g.mu.Unlock()
	l.sessions--
	if l.sessions > 0 {
		return
	}
	if g.closed || g.idleOtherThan(l) {
		g.loops[l.slot] = nil
		l.stop()
		return
	}
	// The loop may be asleep without a timeout (release may come from another
	// goroutine): wake it to start counting.
	l.idle.Store(true)
	l.wake()
}

// stopIfIdle stops l when it still has no session; its own goroutine calls it once l has
// waited loopLinger for one.
func (g *loopGroup) stopIfIdle(l *eventLoop) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if l.sessions == 0 && g.loops[l.slot] == l {
		g.loops[l.slot] = nil
		l.stop()
	}
}

// idleOtherThan reports whether a loop other than l runs with no session; under g.mu.
func (g *loopGroup) idleOtherThan(l *eventLoop) bool {
	for _, o := range g.loops {
		if o != nil && o != l && o.sessions == 0 {
			return true
		}
	}
	return false
}

// close stops the idle loops, and makes every other loop stop with its last session.
func (g *loopGroup) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for i, l := range g.loops {
		if l != nil && l.sessions == 0 {
			g.loops[i] = nil
			l.stop()
		}
	}
}

// eventLoop is one goroutine and its epoll set.
type eventLoop struct {
	group    *loopGroup
	slot     int
	sessions int // assigned sessions, registered or about to be; under group.mu

	epfd   int
	wakefd int

	idle atomic.Bool // no session since the last one ended: the loop waits loopLinger, then stops

	mu     sync.Mutex // guards posted, woken and stopped, and the eventfd against its close
	posted []func()
	// spare is the array of the last batch of posted work the runner ran, cleared, which
	// takes the place of posted at the next batch: with the two arrays taking turns,
	// posting allocates nothing once both are large enough. The runner's only.
	spare   []func()
	woken   bool
	stopped bool
	halt    atomic.Bool   // stopped, for the loop to read each turn without taking mu
	done    chan struct{} // closed when the loop has stopped and closed its descriptors

	// inRelease is set while the loop's runner gives a server connection back to the
	// pool, which may lend it at once, in the same call, to a session of this loop: the
	// answer posted to that session then needs no wake-up, and selfPosted tells the runner
	// to look for it before it waits again (see releaseServer).
	inRelease  atomic.Bool
	selfPosted atomic.Bool

	// gen counts the goroutines that have run the loop: a runner whose handler detached
	// (see loopSession.detach) sees it change and stops being the runner.
	gen atomic.Uint64

	// Used by the loop's runner only.
	ends      []*loopEnd // by slot; nil where free, and at 0, the eventfd's slot
	freeSlots []int32
	lastToken loopToken
	again     []*loopSession            // sessions that ran out of budget with work left
	timed     map[*loopSession]struct{} // sessions waiting for a deadline
	// quiet holds sessions in transaction mode found quiet at the end of a turn, whose
	// buffers go back once they have stayed so for a look of sweepQuiet; lastSweep is
	// when it last looked.
	quiet     []*loopSession
	lastSweep time.Time
	// plain is the last text of a Query or Parse that the prefilter cleared, for the
	// loop's sessions (see passClientRun).
	plain plainMemo
	// batch holds the last writes of a turn, sent together when the turn ends; nil
	// without io_uring, when each goes out at once.
	batch *sendBatch
	// recv reads the sockets a wait reported readable together, over batch's ring; nil
	// with batch.
	recv *recvBatch
}

func newEventLoop(g *loopGroup, slot int, plainSends bool) (*eventLoop, error) {
	epfd, wakefd, err := epollWithWakeup(unix.EpollEvent{Events: unix.EPOLLIN, Fd: 0, Pad: int32(wakeToken)})
	if err != nil {
		return nil, err
	}
	l := &eventLoop{
		group: g, slot: slot, epfd: epfd, wakefd: wakefd,
		ends:  make([]*loopEnd, 1),
		timed: make(map[*loopSession]struct{}),
		done:  make(chan struct{}),
	}
	if !plainSends {
		l.batch = newSendBatch()
		l.recv = newRecvBatch(l.batch)
	}
	return l, nil
}

// epollWithWakeup creates an epoll set watching a new eventfd, registered with ev, that
// other goroutines write to to wake whoever waits on the set.
func epollWithWakeup(ev unix.EpollEvent) (epfd, wakefd int, err error) {
	epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, -1, err
	}
	wakefd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return -1, -1, err
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(wakefd)
		return -1, -1, err
	}
	return epfd, wakefd, nil
}

// post runs f on the loop's goroutine, reporting false when the loop has stopped. Work
// posted to a stopped loop is dropped: a loop stops only when it has no session left
// that the work could concern.
func (l *eventLoop) post(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	l.posted = append(l.posted, f)
	if l.inRelease.Load() {
		l.selfPosted.Store(true)
	} else {
		l.wakeLocked()
	}
	return true
}

// takeSelfPosted returns the work posted without a wake-up (see inRelease), with the
// rest posted since the last wake-up.
func (l *eventLoop) takeSelfPosted() []func() {
	l.mu.Lock()
	defer l.mu.Unlock()
	work := l.posted
	l.posted, l.spare = l.spare, nil
	return work
}

// wakeLocked makes the loop's epoll_wait return; l.mu is held, so that the eventfd
// cannot be closed (and its number reused) meanwhile.
func (l *eventLoop) wakeLocked() {
	if l.stopped || l.woken {
		return
	}
	l.woken = true
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(l.wakefd, one[:])
}

// wake makes the loop go round once.
func (l *eventLoop) wake() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wakeLocked()
}

// stop ends the loop; it may be called from any goroutine (a session that could not be
// adopted gives its place back from its own), so the loop is woken to notice.
func (l *eventLoop) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.woken = false
	l.wakeLocked()
	l.stopped = true
	l.halt.Store(true)
}

// takePosted returns the work posted since the last call and re-arms the wake-up.
func (l *eventLoop) takePosted() []func() {
	var buf [8]byte
	_, _ = unix.Read(l.wakefd, buf[:])
	l.mu.Lock()
	defer l.mu.Unlock()
	l.woken = false
	work := l.posted
	l.posted, l.spare = l.spare, nil
	return work
}

// wait fills events with those of the next turn and reports how many. The writes the
// last turn left in the send batch go first; the sockets the wait reports readable are
// received from in one call, when there are two or more.
func (l *eventLoop) wait(events []unix.EpollEvent) (int, error) {
	if l.batch.due() {
		l.batch.send()
	}
	n, err := unix.EpollWait(l.epfd, events, l.waitTimeout())
	if n > 1 {
		l.recv.receive(l, events[:n])
	}
	return n, err
}

// waitTimeout is how long the loop's wait may last, in milliseconds (-1: for ever): not
// at all with sessions queued for another turn, loopIdleWait with deadlines to check or
// quiet sessions to look at, loopLinger when the loop has no session left.
func (l *eventLoop) waitTimeout() int {
	switch {
	case len(l.again) > 0:
		return 0
	case len(l.timed) > 0 || len(l.quiet) > 0:
		return int(loopIdleWait / time.Millisecond)
	case l.idle.Load():
		return int(loopLinger / time.Millisecond)
	}
	return -1
}

func (l *eventLoop) run() {
	gen := l.gen.Load()
	lastYield := time.Now()
	events := make([]unix.EpollEvent, 128)
	for turn := 1; !l.halt.Load(); turn++ {
		// The clock is read every few turns only: a turn takes microseconds.
		if turn%loopYieldTurns == 0 {
			now := time.Now()
			if now.Sub(l.lastSweep) >= loopIdleWait {
				l.sweepQuiet(now)
			}
			if now.Sub(lastYield) >= loopYieldEvery {
				// A goroutine that the scheduler never sees switch for 10 ms is taken for a
				// runaway: the runtime preempts it and takes its processor at its next
				// system call, and its monitor thread polls every 20 µs for a while after.
				// The loop's goroutine, which only runs and makes system calls, would
				// trigger that all the time; yielding now and then keeps it a good citizen.
				lastYield = now
				runtime.Gosched()
			}
		}
		n, err := l.wait(events)
		if n == 0 && err == nil && len(l.quiet) > 0 {
			l.sweepQuiet(time.Now())
		}
		if n == 0 && err == nil && l.idle.Load() {
			l.group.stopIfIdle(l)
			continue
		}
		if err != nil && err != unix.EINTR {
			// Not expected with a valid epoll descriptor; end the sessions rather
			// than spin.
			l.failAll()
			continue
		}
		for _, ev := range events[:max(n, 0)] {
			if loopToken(ev.Pad) == wakeToken {
				if !l.runPosted(l.takePosted(), gen) {
					return
				}
				continue
			}
			if end := l.ends[ev.Fd]; end != nil && end.token == loopToken(ev.Pad) {
				if end.ls == nil {
					end.pio.idleEvent(l, end) // a pooled connection parked idle
					continue
				}
				end.ls.event(end, ev.Events)
				if l.gen.Load() != gen {
					// The new runner sees the remaining events again: the epoll
					// set is level-triggered.
					return
				}
			}
		}
		// What follows is rarely needed; a look at each costs no call, no locked
		// instruction.
		if len(l.again) > 0 && !l.runAgain(gen) {
			return
		}
		if l.selfPosted.Load() && l.selfPosted.Swap(false) && !l.runPosted(l.takeSelfPosted(), gen) {
			return
		}
		if len(l.timed) > 0 {
			l.checkDeadlines()
		}
		l.recv.release()
	}
	l.destroy()
}

// runAgain gives the sessions that used up their budget another turn, after every other
// ready session has had one. It reports false when a handler detached, after handing the
// sessions it did not reach to the new runner.
func (l *eventLoop) runAgain(gen uint64) bool {
	again := l.again
	l.again = nil
	for i, ls := range again {
		ls.queued = false
		ls.process()
		if l.gen.Load() != gen {
			rest := append([]*loopSession(nil), again[i+1:]...)
			l.post(func() { l.again = append(l.again, rest...) })
			return false
		}
	}
	clear(again)
	if l.again == nil {
		l.again = again[:0]
	}
	return true
}

// runPosted runs work, posted to the loop, on the runner of generation gen; it reports
// false when the loop changed runners meanwhile, the rest of work posted again for the
// new one.
func (l *eventLoop) runPosted(work []func(), gen uint64) bool {
	for i, f := range work {
		f()
		if l.gen.Load() != gen {
			l.repost(work[i+1:])
			return false
		}
	}
	// Still the runner: no handler detached since the last look.
	clear(work)
	l.spare = work[:0]
	return true
}

// repost puts work taken by a runner that is no longer the runner back at the head of
// the queue, for the new runner.
func (l *eventLoop) repost(work []func()) {
	if len(work) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.posted = append(append([]func(){}, work...), l.posted...)
	l.wakeLocked()
}

func (l *eventLoop) checkDeadlines() {
	if len(l.timed) == 0 {
		return
	}
	now := time.Now()
	for ls := range l.timed {
		if now.After(ls.deadline) {
			ls.teardown()
		}
	}
}

// failAll ends every session of the loop.
func (l *eventLoop) failAll() {
	sessions := make(map[*loopSession]bool)
	for _, end := range l.ends {
		if end != nil && end.ls != nil {
			sessions[end.ls] = true
		}
	}
	for ls := range sessions {
		ls.teardown()
	}
}

// destroy closes the loop's descriptors once it has stopped. Sessions that were never
// registered cannot exist: the loop stops only when its last session has gone.
func (l *eventLoop) destroy() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	l.halt.Store(true)
	l.posted = nil
	unix.Close(l.epfd)
	unix.Close(l.wakefd)
	l.batch.close()
	close(l.done)
}

// add registers a socket with the loop and returns its token.
func (l *eventLoop) add(end *loopEnd) error {
	l.lastToken++
	if l.lastToken == wakeToken {
		l.lastToken++
	}
	end.token = l.lastToken
	if n := len(l.freeSlots); n > 0 {
		end.slot = l.freeSlots[n-1]
		l.freeSlots = l.freeSlots[:n-1]
	} else {
		end.slot = int32(len(l.ends))
		l.ends = append(l.ends, nil)
	}
	end.events = unix.EPOLLIN
	ev := end.epollEvent(end.events)
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, end.fd, &ev); err != nil {
		l.freeSlots = append(l.freeSlots, end.slot)
		end.slot = 0
		return err
	}
	end.watched = true
	l.ends[end.slot] = end
	return nil
}

// epollEvent is the epoll registration of end for the events wanted.
func (end *loopEnd) epollEvent(want uint32) unix.EpollEvent {
	return unix.EpollEvent{Events: want, Fd: end.slot, Pad: int32(end.token)}
}

// watch brings the epoll registration of end in line with the events wanted. A socket
// that has hung up is reported whatever its mask says, so one that may not be read is
// taken out of the set altogether until it may.
func (l *eventLoop) watch(end *loopEnd, want uint32) {
	switch {
	case end.hup && want&unix.EPOLLIN == 0 && want&unix.EPOLLOUT == 0:
		if end.watched {
			_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, end.fd, nil)
			end.watched = false
		}
	case !end.watched:
		ev := end.epollEvent(want)
		if unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, end.fd, &ev) == nil {
			end.watched, end.events = true, want
		}
	case end.events != want:
		ev := end.epollEvent(want)
		if unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, end.fd, &ev) == nil {
			end.events = want
		}
	}
}

// unwatch takes a socket out of the epoll set until watch puts it back.
func (l *eventLoop) unwatch(end *loopEnd) {
	if end.watched {
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, end.fd, nil)
		end.watched, end.events = false, 0
	}
}

// remove takes a socket out of the loop for good; it does not close it.
func (l *eventLoop) remove(end *loopEnd) {
	end.sink.sendDeferred() // what the batch holds for it goes first
	l.unwatch(end)
	if end.slot > 0 && l.ends[end.slot] == end {
		l.ends[end.slot] = nil
		l.freeSlots = append(l.freeSlots, end.slot)
	}
	end.slot = 0
}
