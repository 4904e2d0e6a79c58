//go:build linux && (amd64 || arm64)

package uring

import (
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BenchmarkRelay measures what an event loop pays per round trip it relays, the way
// leafproxy's loop relays PostgreSQL's small messages: 8 clients each send a 32-byte
// message and wait for its 64-byte answer, through a relay thread, to 8 servers that
// answer each message. The relay waits, receives and sends either over epoll with
// recvfrom and sendto (as the event loop does today), or over a ring, where receives
// complete in the kernel and the sends go with the next wait. The figure that counts is
// relay-cpu-ns/op, the relay thread's CPU time per round trip (CLOCK_THREAD_CPUTIME_ID).
func BenchmarkRelay(b *testing.B) {
	b.Run("epoll", func(b *testing.B) { benchRelay(b, relayEpoll) })
	b.Run("ring", func(b *testing.B) { benchRelay(b, relayRing(false)) })
	b.Run("ring-multishot", func(b *testing.B) { benchRelay(b, relayRing(true)) })
}

const relayPairs = 8

// relayFunc relays between fds[2i] and fds[2i+1] until stop is set, on its own locked
// thread, and returns that thread's CPU time.
type relayFunc func(tb testing.TB, fds []int, stop *atomic.Bool) time.Duration

func benchRelay(b *testing.B, relay relayFunc) {
	var fds []int
	var clients, servers []net.Conn
	for range relayPairs {
		c, cfd := relayLeg(b)
		s, sfd := relayLeg(b)
		clients, servers = append(clients, c), append(servers, s)
		fds = append(fds, cfd, sfd)
	}
	var stop atomic.Bool
	cpu := make(chan time.Duration, 1)
	go func() { cpu <- relay(b, fds, &stop) }()
	for _, s := range servers {
		go answer(s)
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, c := range clients {
		n := b.N / relayPairs
		if i < b.N%relayPairs {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ask(b, c, n)
		}()
	}
	wg.Wait()
	b.StopTimer()
	stop.Store(true)
	b.ReportMetric(float64((<-cpu).Nanoseconds())/float64(b.N), "relay-cpu-ns/op")
	for _, c := range append(clients, servers...) {
		c.Close()
	}
}

// relayLeg returns a peer's connection and, as a non-blocking descriptor, the relay's
// end of it.
func relayLeg(tb testing.TB) (net.Conn, int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	acc := <-accepted
	defer acc.Close()
	return peer, dupFd(tb, acc)
}

func ask(tb testing.TB, c net.Conn, n int) {
	msg := make([]byte, 32)
	reply := make([]byte, 64)
	for range n {
		if _, err := c.Write(msg); err != nil {
			tb.Error(err)
			return
		}
		if _, err := io.ReadFull(c, reply); err != nil {
			tb.Error(err)
			return
		}
	}
}

func answer(s net.Conn) {
	msg := make([]byte, 32)
	reply := make([]byte, 64)
	for {
		if _, err := io.ReadFull(s, msg); err != nil {
			return
		}
		if _, err := s.Write(reply); err != nil {
			return
		}
	}
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

func relayEpoll(tb testing.TB, fds []int, stop *atomic.Bool) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := threadCPU()
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		tb.Error(err)
		return 0
	}
	defer unix.Close(epfd)
	for i, fd := range fds {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(i)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			tb.Error(err)
			return 0
		}
	}
	events := make([]unix.EpollEvent, 64)
	buf := make([]byte, 16<<10)
	for !stop.Load() {
		n, err := unix.EpollWait(epfd, events, 100)
		if err != nil && err != unix.EINTR {
			tb.Error(err)
			return 0
		}
		for _, ev := range events[:max(n, 0)] {
			i := int(ev.Fd)
			got, _, errno := syscall.RawSyscall6(unix.SYS_RECVFROM, uintptr(fds[i]), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
			if errno == unix.EAGAIN {
				continue
			}
			if errno != 0 || got == 0 {
				return threadCPU() - start // a peer closed: the benchmark is over
			}
			sent, _, errno := syscall.RawSyscall6(unix.SYS_SENDTO, uintptr(fds[i^1]), uintptr(unsafe.Pointer(&buf[0])), got, unix.MSG_NOSIGNAL, 0, 0)
			if errno != 0 || sent != got {
				tb.Errorf("send: %d of %d: %v", sent, got, errno)
				return 0
			}
		}
	}
	return threadCPU() - start
}

func relayRing(multishot bool) relayFunc {
	return func(tb testing.TB, fds []int, stop *atomic.Bool) time.Duration {
		return relayOverRing(tb, fds, stop, multishot)
	}
}

func relayOverRing(tb testing.TB, fds []int, stop *atomic.Bool, multishot bool) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := threadCPU()
	r, err := New(64)
	if err != nil {
		tb.Error(err)
		return 0
	}
	defer r.Close()
	bufs, err := r.NewBufRing(1, 64, 16<<10)
	if err != nil {
		tb.Error(err)
		return 0
	}
	const sendTag = 1 << 32
	for i, fd := range fds {
		_ = r.PrepRecv(fd, 1, multishot, uint64(i))
	}
	var used []uint16
	sends := 0
	for !stop.Load() {
		if _, err := r.Enter(uint32(sends+1), 100*time.Millisecond); err != nil {
			tb.Error(err)
			return 0
		}
		for _, id := range used {
			bufs.Recycle(id) // the sends from them have completed
		}
		used, sends = used[:0], 0
		first, second := r.Completions()
		for _, part := range [][]CQE{first, second} {
			for _, c := range part {
				if c.UserData&sendTag != 0 {
					continue // a send of the last turn (checked in full by the tests)
				}
				i := int(c.UserData)
				if c.Res <= 0 {
					return threadCPU() - start // a peer closed: the benchmark is over
				}
				id := c.BufferID()
				_ = r.PrepSend(fds[i^1], bufs.Buffer(id, int(c.Res)), unix.MSG_NOSIGNAL, sendTag|uint64(i^1))
				if c.Flags&FlagMore == 0 {
					_ = r.PrepRecv(fds[i], 1, multishot, uint64(i))
				}
				used = append(used, id)
				sends++
			}
		}
		r.Consume(len(first) + len(second))
	}
	return threadCPU() - start
}
