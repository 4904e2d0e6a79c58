//go:build linux && (amd64 || arm64)

package uring

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Setup flags (io_uring_setup(2)).
const (
	setupCQSize        = 1 << 3
	setupSubmitAll     = 1 << 7
	setupCoopTaskrun   = 1 << 8
	setupSingleIssuer  = 1 << 12
	setupDeferTaskrun  = 1 << 13
	featSingleMmap     = 1 << 0
	offSQRing          = 0
	offCQRing          = 0x8000000
	offSQEs            = 0x10000000
	enterGetEvents     = 1 << 0
	enterExtArg        = 1 << 3
	registerPbufRing   = 22
	unregisterPbufRing = 23
)

// Operations (the IORING_OP_ values).
const (
	opNop         = 0
	opPollAdd     = 6
	opAsyncCancel = 14
	opSend        = 26
	opRecv        = 27
)

// SQE flags.
const (
	sqeBufferSelect = 1 << 5
)

// CQE flags.
const (
	// FlagBuffer marks a completion that used a provided buffer; its id is in the flags'
	// upper 16 bits (CQE.BufferID).
	FlagBuffer = 1 << 0
	// FlagMore marks a completion of a multishot request that goes on.
	FlagMore    = 1 << 1
	bufferShift = 16
)

// pollAddMulti makes a poll request multishot, recvMultishot a receive.
const (
	pollAddMulti  = 1 << 0
	recvMultishot = 1 << 1
)

// SQE is a submission queue entry, laid out as struct io_uring_sqe.
type SQE struct {
	Opcode      uint8
	Flags       uint8
	Ioprio      uint16
	Fd          int32
	Off         uint64
	Addr        uint64
	Len         uint32
	OpFlags     uint32
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	SpliceFdIn  int32
	Addr3       uint64
	pad         uint64
}

// CQE is a completion queue entry, laid out as struct io_uring_cqe.
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// BufferID is the id of the provided buffer the completion used; valid when
// Flags&FlagBuffer is set.
func (c *CQE) BufferID() uint16 { return uint16(c.Flags >> bufferShift) }

type sqOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqOffsets
	cqOff                                                                  cqOffsets
}

type getEventsArg struct {
	sigmask     uint64
	sigmaskSize uint32
	minWaitUsec uint32
	ts          uint64
}

// Ring is an io_uring instance. It is not safe for concurrent use: one goroutine, on a
// locked OS thread (see the package comment), prepares, enters and reaps.
type Ring struct {
	fd       int
	ringMem  []byte // the submission and completion rings (one mapping)
	sqeMem   []byte
	sqTail   *uint32
	sqHead   *uint32
	sqMask   uint32
	sqes     []SQE
	cqHead   *uint32
	cqTail   *uint32
	cqMask   uint32
	cqes     []CQE
	tail     uint32 // the submission tail as prepared, ahead of *sqTail until Enter
	unsent   uint32 // entries prepared and not yet submitted
	bufRings []*BufRing
}

// ErrUnsupported is returned by New when the kernel has no io_uring, or not the features
// this package needs (single issuer and deferred task work: Linux 6.1), or when it is
// turned off (kernel.io_uring_disabled, or a seccomp profile such as a container's).
var ErrUnsupported = errors.New("io_uring is not available")

// New sets up a ring of entries submission entries (a power of two) and four times as
// many completion entries. The calling goroutine must hold its OS thread locked, and
// use the ring only from it.
func New(entries uint32) (*Ring, error) {
	return setup(entries, setupSingleIssuer|setupDeferTaskrun)
}

// NewSender sets up a ring for sends alone (PrepSend), which any goroutine may use, one at
// a time: with no receive waiting in the kernel, there is no completion work to run on
// the thread that made the ring, which therefore need not be locked.
func NewSender(entries uint32) (*Ring, error) {
	return setup(entries, 0)
}

func setup(entries, flags uint32) (*Ring, error) {
	p := params{
		flags:     setupCQSize | setupSubmitAll | setupCoopTaskrun | flags,
		cqEntries: 4 * entries,
	}
	fd, _, errno := syscall.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		switch errno {
		case unix.ENOSYS, unix.EPERM, unix.EINVAL, unix.EACCES:
			return nil, fmt.Errorf("%w: io_uring_setup: %v", ErrUnsupported, errno)
		}
		return nil, os.NewSyscallError("io_uring_setup", errno)
	}
	r := &Ring{fd: int(fd)}
	if p.features&featSingleMmap == 0 {
		r.Close()
		return nil, fmt.Errorf("%w: the kernel maps the rings separately (before Linux 5.4)", ErrUnsupported)
	}
	if err := r.mapRings(&p); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Ring) mapRings(p *params) error {
	size := max(p.sqOff.array+p.sqEntries*4, p.cqOff.cqes+p.cqEntries*uint32(unsafe.Sizeof(CQE{})))
	mem, err := unix.Mmap(r.fd, offSQRing, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return os.NewSyscallError("mmap", err)
	}
	r.ringMem = mem
	sqeSize := int(p.sqEntries) * int(unsafe.Sizeof(SQE{}))
	if r.sqeMem, err = unix.Mmap(r.fd, offSQEs, sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return os.NewSyscallError("mmap", err)
	}
	at := func(off uint32) unsafe.Pointer { return unsafe.Pointer(&mem[off]) }
	r.sqHead = (*uint32)(at(p.sqOff.head))
	r.sqTail = (*uint32)(at(p.sqOff.tail))
	r.sqMask = *(*uint32)(at(p.sqOff.ringMask))
	r.sqes = unsafe.Slice((*SQE)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	// The indirection array maps each slot to the entry of the same index, once.
	array := unsafe.Slice((*uint32)(at(p.sqOff.array)), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.cqHead = (*uint32)(at(p.cqOff.head))
	r.cqTail = (*uint32)(at(p.cqOff.tail))
	r.cqMask = *(*uint32)(at(p.cqOff.ringMask))
	r.cqes = unsafe.Slice((*CQE)(at(p.cqOff.cqes)), p.cqEntries)
	r.tail = atomic.LoadUint32(r.sqTail)
	return nil
}

// Close releases the ring and its buffer rings. Requests still under way are cancelled
// by the kernel; their buffers (provided ones included) must stay mapped until then,
// which Close ensures by unmapping only after the ring's descriptor is closed.
func (r *Ring) Close() error {
	var err error
	if r.fd >= 0 {
		err = unix.Close(r.fd)
		r.fd = -1
	}
	for _, m := range [][]byte{r.ringMem, r.sqeMem} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	r.ringMem, r.sqeMem = nil, nil
	for _, b := range r.bufRings {
		b.unmap()
	}
	r.bufRings = nil
	return err
}

// Free is how many entries can be prepared before Enter must submit them.
func (r *Ring) Free() int {
	return len(r.sqes) - int(r.tail-atomic.LoadUint32(r.sqHead))
}

// next returns a zeroed entry to prepare, or nil when the submission ring is full.
func (r *Ring) next() *SQE {
	if r.Free() == 0 {
		return nil
	}
	e := &r.sqes[r.tail&r.sqMask]
	*e = SQE{}
	r.tail++
	r.unsent++
	return e
}

// errFull is returned by the Prep methods when the submission ring is full; the caller
// enters first.
var errFull = errors.New("io_uring submission ring full")

// PrepRecv prepares a receive on fd into a buffer of the group's provided-buffer ring,
// chosen by the kernel when data arrives. A multishot receive (Linux 6.0) stays armed:
// it completes each time data arrives, with FlagMore set while it goes on; it ends at
// the peer's close, at an error, or when no buffer is left (ENOBUFS).
func (r *Ring) PrepRecv(fd int, group uint16, multishot bool, userData uint64) error {
	e := r.next()
	if e == nil {
		return errFull
	}
	e.Opcode, e.Flags, e.Fd, e.BufIndex, e.UserData = opRecv, sqeBufferSelect, int32(fd), group, userData
	if multishot {
		e.Ioprio = recvMultishot
	}
	return nil
}

// PrepSend prepares a send of p on fd that completes while it is submitted: MSG_DONTWAIT
// is added to flags (see the package comment), so p is free once Enter returns.
func (r *Ring) PrepSend(fd int, p []byte, flags uint32, userData uint64) error {
	return r.prepNow(opSend, fd, p, flags, userData)
}

// PrepRecvNow prepares a receive on fd into p that completes while it is submitted:
// MSG_DONTWAIT is added to flags, so a socket with no data completes it with -EAGAIN
// instead of leaving it to wait (see the package comment). p is written by the time
// Enter returns, and must stay alive and untouched until then.
func (r *Ring) PrepRecvNow(fd int, p []byte, flags uint32, userData uint64) error {
	return r.prepNow(opRecv, fd, p, flags, userData)
}

// prepNow prepares op (a send or a receive) on fd over p with MSG_DONTWAIT.
func (r *Ring) prepNow(op uint8, fd int, p []byte, flags uint32, userData uint64) error {
	e := r.next()
	if e == nil {
		return errFull
	}
	e.Opcode, e.Fd, e.UserData = op, int32(fd), userData
	if len(p) > 0 {
		e.Addr = uint64(uintptr(unsafe.Pointer(&p[0])))
		e.Len = uint32(len(p))
	}
	e.OpFlags = flags | unix.MSG_DONTWAIT
	return nil
}

// PrepPoll prepares a poll of fd for events (POLLIN, POLLOUT…); multishot keeps it
// armed after each completion (FlagMore says it still is).
func (r *Ring) PrepPoll(fd int, events uint32, multishot bool, userData uint64) error {
	e := r.next()
	if e == nil {
		return errFull
	}
	e.Opcode, e.Fd, e.OpFlags, e.UserData = opPollAdd, int32(fd), events, userData
	if multishot {
		e.Len = pollAddMulti
	}
	return nil
}

// PrepCancel prepares the cancellation of the request submitted with target as its user
// data. The cancelled request completes with -ECANCELED, unless it completed first.
func (r *Ring) PrepCancel(target, userData uint64) error {
	e := r.next()
	if e == nil {
		return errFull
	}
	e.Opcode, e.Fd, e.Addr, e.UserData = opAsyncCancel, -1, target, userData
	return nil
}

// PrepNop prepares a request that does nothing and completes at once.
func (r *Ring) PrepNop(userData uint64) error {
	e := r.next()
	if e == nil {
		return errFull
	}
	e.Opcode, e.UserData = opNop, userData
	return nil
}

// Enter submits what was prepared and runs the completion work due, then waits until
// at least wait completions are in the ring (those of this submission included), or
// until timeout when it is positive. A negative timeout waits without limit. It reports
// how many entries it submitted; running out of time is not an error.
func (r *Ring) Enter(wait uint32, timeout time.Duration) (int, error) {
	atomic.StoreUint32(r.sqTail, r.tail)
	toSubmit := r.unsent
	flags := uintptr(enterGetEvents)
	var arg unsafe.Pointer
	var argSize uintptr
	var ts unix.Timespec
	var ea getEventsArg
	if wait > 0 && timeout >= 0 {
		ts = unix.NsecToTimespec(int64(timeout))
		ea.ts = uint64(uintptr(unsafe.Pointer(&ts)))
		flags |= enterExtArg
		arg, argSize = unsafe.Pointer(&ea), unsafe.Sizeof(ea)
	}
	for {
		var n uintptr
		var errno syscall.Errno
		if wait == 0 {
			// It does not block: no need for the runtime's system-call bookkeeping.
			n, _, errno = syscall.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), 0, flags, uintptr(arg), argSize)
		} else {
			n, _, errno = syscall.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(wait), flags, uintptr(arg), argSize)
		}
		switch errno {
		case 0:
			r.unsent -= uint32(n)
			return int(n), nil
		case unix.ETIME:
			r.unsent = 0 // SUBMIT_ALL: all were submitted before the wait
			return int(toSubmit), nil
		case unix.EINTR:
			// Whatever was submitted is gone from the ring: submit the rest, if any.
			r.unsent = r.tail - atomic.LoadUint32(r.sqHead)
			toSubmit = r.unsent
			continue
		}
		return 0, os.NewSyscallError("io_uring_enter", errno)
	}
}

// Completions returns the completions in the ring, in order, in up to two slices (the
// ring wraps); Consume gives their slots back.
func (r *Ring) Completions() (first, second []CQE) {
	head := *r.cqHead // only this goroutine moves the head
	tail := atomic.LoadUint32(r.cqTail)
	if head == tail {
		return nil, nil
	}
	lo, hi := head&r.cqMask, tail&r.cqMask
	if lo < hi {
		return r.cqes[lo:hi], nil
	}
	return r.cqes[lo:], r.cqes[:hi]
}

// Consume gives back the slots of the n oldest completions.
func (r *Ring) Consume(n int) {
	atomic.StoreUint32(r.cqHead, *r.cqHead+uint32(n))
}
