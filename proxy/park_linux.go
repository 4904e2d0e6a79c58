//go:build linux

package proxy

import (
	"encoding/binary"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// parkLot holds the parked sessions of a server (see park.go): an epoll set with the
// client socket of each, armed for one event (EPOLLONESHOT), and one goroutine that waits
// on it, resumes the sessions whose socket became readable, and every parkTick looks for
// sessions to park. It runs while the server has sessions in transaction mode, and goes
// on for one to two parkTicks after the last has left, so that clients that connect for
// each transaction do not start and stop it (an epoll set, an eventfd and a goroutine)
// every time.
//
// A socket stays in the epoll set, disarmed, after its event; closing it removes it, so
// the lot never has to take out a descriptor that may have been closed and reused.
type parkLot struct {
	mu        sync.Mutex
	run       *lotRun                   // nil while no session is in the lot
	sessions  map[*pooledConn]struct{}  // every session that may park
	parked    map[loopToken]*pooledConn // by token: the parked ones
	lastToken loopToken
	scratch   []*pooledConn // the lot goroutine's copy of sessions
	// empty: no session was in the lot at the last sweep; closed: the server has
	// closed, the lot takes no more sessions and stops with the last.
	empty, closed bool
}

// lotRun is one run of the lot's goroutine, with its descriptors.
type lotRun struct {
	epfd, wakefd int
}

// parkLot returns the server's lot, creating it; nil once the pool has closed.
func (s *Server) parkLot() *parkLot {
	s.pooling.mu.Lock()
	defer s.pooling.mu.Unlock()
	if s.pooling.closed {
		return nil
	}
	if s.pooling.lot == nil {
		s.pooling.lot = &parkLot{sessions: make(map[*pooledConn]struct{}), parked: make(map[loopToken]*pooledConn)}
	}
	return s.pooling.lot
}

func (s *Server) existingParkLot() *parkLot {
	s.pooling.mu.Lock()
	defer s.pooling.mu.Unlock()
	return s.pooling.lot
}

// enter adds a session that may park, starting the lot's goroutine if needed.
func (l *parkLot) enter(v *pooledConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	if l.run == nil {
		r, err := newLotRun()
		if err != nil {
			v.c.log.WithError(err).Warn("idle sessions cannot be parked")
			return false
		}
		l.run = r
		go l.loop(r)
	}
	l.sessions[v] = struct{}{}
	return true
}

func newLotRun() (*lotRun, error) {
	epfd, wakefd, err := epollWithWakeup(unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wakeToken)})
	if err != nil {
		return nil, err
	}
	return &lotRun{epfd: epfd, wakefd: wakefd}, nil
}

// leave takes a session that has ended out of the lot; once the server has closed, the
// last stops the lot's goroutine.
func (l *parkLot) leave(v *pooledConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.sessions[v]; !ok {
		return
	}
	delete(l.sessions, v)
	if v.park.token != 0 {
		delete(l.parked, v.park.token)
		v.park.token = 0
	}
	if len(l.sessions) == 0 && l.closed {
		l.stopLocked()
	}
}

// close stops the lot's goroutine once no session is left, and keeps it from starting
// again.
func (l *parkLot) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if len(l.sessions) == 0 {
		l.stopLocked()
	}
}

// stopLocked ends the run of the lot's goroutine; l.mu is held.
func (l *parkLot) stopLocked() {
	if l.run == nil {
		return
	}
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(l.run.wakefd, one[:])
	l.run = nil
}

// park arms the session's client socket and records the session as parked.
func (l *parkLot) park(v *pooledConn) bool {
	sc, ok := v.c.client.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.run == nil {
		return false
	}
	if _, ok := l.sessions[v]; !ok {
		return false // ended meanwhile
	}
	l.lastToken++
	for l.lastToken == wakeToken || l.parked[l.lastToken] != nil {
		l.lastToken++
	}
	tok := l.lastToken
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(tok)}
	var ctlErr error
	err = rc.Control(func(fd uintptr) {
		// The descriptor is open while Control runs. It may be in the set from an
		// earlier park, disarmed: re-arm it.
		ctlErr = unix.EpollCtl(l.run.epfd, unix.EPOLL_CTL_MOD, int(fd), &ev)
		if ctlErr == unix.ENOENT {
			ctlErr = unix.EpollCtl(l.run.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev)
		}
	})
	if err != nil || ctlErr != nil {
		return false
	}
	l.parked[tok] = v
	v.park.token = tok
	return true
}

// unpark takes a parked session out of the lot's care, reporting whether it was parked;
// whoever unparks a session owns it.
func (l *parkLot) unpark(v *pooledConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if v.park.token == 0 || l.parked[v.park.token] != v {
		return false
	}
	delete(l.parked, v.park.token)
	v.park.token = 0
	return true
}

// parkedCount counts the parked sessions.
func (l *parkLot) parkedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.parked)
}

// loop is the lot's goroutine for run r.
func (l *parkLot) loop(r *lotRun) {
	defer func() {
		unix.Close(r.epfd)
		unix.Close(r.wakefd)
	}()
	events := make([]unix.EpollEvent, 128)
	var wake []*pooledConn
	next := time.Now().Add(parkTick)
	for {
		wait := max(time.Until(next), 0)
		n, err := unix.EpollWait(r.epfd, events, int(wait/time.Millisecond)+1)
		if err != nil && err != unix.EINTR {
			n = 0
		}
		l.mu.Lock()
		if l.run != r {
			l.mu.Unlock()
			return
		}
		for _, ev := range events[:max(n, 0)] {
			tok := loopToken(ev.Fd)
			if tok == wakeToken {
				continue
			}
			if v := l.parked[tok]; v != nil {
				delete(l.parked, tok)
				v.park.token = 0
				wake = append(wake, v)
			}
		}
		l.mu.Unlock()
		for _, v := range wake {
			go v.c.resume(v)
		}
		clear(wake)
		wake = wake[:0]
		if !time.Now().Before(next) {
			if l.idle(r) {
				return
			}
			l.sweep()
			next = time.Now().Add(parkTick)
		}
	}
}

// idle stops run r when no session has been in the lot since the last sweep, and reports
// whether it did.
func (l *parkLot) idle(r *lotRun) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.sessions) > 0 {
		l.empty = false
		return false
	}
	if !l.empty {
		l.empty = true
		return false
	}
	if l.run == r {
		l.run = nil
	}
	l.empty = false
	return true
}

// sweep interrupts the wait of the sessions that have waited for their client since the
// last sweep with nothing outstanding, so that they park.
func (l *parkLot) sweep() {
	l.mu.Lock()
	all := l.scratch[:0]
	for v := range l.sessions {
		all = append(all, v)
	}
	l.mu.Unlock()
	for _, v := range all {
		v.mu.Lock()
		p := &v.park
		if p.blocked && !p.interrupted {
			if p.seen && v.parkableLocked() {
				p.interrupted = true
				_ = v.c.client.SetReadDeadline(time.Unix(1, 0))
			} else {
				p.seen = true
			}
		}
		v.mu.Unlock()
	}
	clear(all)
	l.scratch = all[:0]
}
