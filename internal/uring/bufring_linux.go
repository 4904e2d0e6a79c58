//go:build linux && (amd64 || arm64)

package uring

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BufRing is a ring of provided buffers (IORING_REGISTER_PBUF_RING, Linux 5.19): count
// buffers of size bytes that receives of its group take as data arrives, so that a
// socket waiting for data holds no buffer. The buffers live outside the Go heap, in a
// mapping of their own: the kernel writes them while no Go reference needs to exist.
type BufRing struct {
	ring   *Ring
	group  uint16
	mask   uint16
	size   int
	tail   uint16
	entMem []byte // the entries (struct io_uring_buf), the tail inside the first
	bufMem []byte // the buffers, one after the other
	tailp  *uint16
}

type bufEntry struct {
	addr uint64
	len  uint32
	bid  uint16
	resv uint16
}

type bufReg struct {
	ringAddr    uint64
	ringEntries uint32
	bgid        uint16
	flags       uint16
	resv        [3]uint64
}

// NewBufRing registers count (a power of two, at most 32768) buffers of size bytes as
// group on r, all of them available.
func (r *Ring) NewBufRing(group uint16, count, size int) (*BufRing, error) {
	if count <= 0 || count > 1<<15 || count&(count-1) != 0 {
		return nil, fmt.Errorf("uring: %d buffers: not a power of two up to 32768", count)
	}
	b := &BufRing{ring: r, group: group, mask: uint16(count - 1), size: size}
	var err error
	entSize := count * int(unsafe.Sizeof(bufEntry{}))
	if b.entMem, err = unix.Mmap(-1, 0, entSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANONYMOUS|unix.MAP_PRIVATE); err != nil {
		return nil, os.NewSyscallError("mmap", err)
	}
	if b.bufMem, err = unix.Mmap(-1, 0, count*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANONYMOUS|unix.MAP_PRIVATE); err != nil {
		b.unmap()
		return nil, os.NewSyscallError("mmap", err)
	}
	b.tailp = (*uint16)(unsafe.Pointer(&b.entMem[14]))
	reg := bufReg{ringAddr: uint64(uintptr(unsafe.Pointer(&b.entMem[0]))), ringEntries: uint32(count), bgid: group}
	_, _, errno := syscall.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerPbufRing, uintptr(unsafe.Pointer(&reg)), 1, 0, 0)
	if errno != 0 {
		b.unmap()
		if errno == unix.EINVAL {
			return nil, fmt.Errorf("%w: provided-buffer rings (Linux 5.19): %v", ErrUnsupported, errno)
		}
		return nil, os.NewSyscallError("io_uring_register", errno)
	}
	for i := range count {
		b.put(uint16(i))
	}
	b.publish()
	r.bufRings = append(r.bufRings, b)
	return b, nil
}

// Size is the size of each buffer.
func (b *BufRing) Size() int { return b.size }

// Buffer returns buffer id's first n bytes, as a completion reported them.
func (b *BufRing) Buffer(id uint16, n int) []byte {
	off := int(id) * b.size
	return b.bufMem[off : off+n : off+b.size]
}

// Recycle makes buffer id available to receives again; the data it held must not be
// used after.
func (b *BufRing) Recycle(id uint16) {
	b.put(id)
	b.publish()
}

// put adds buffer id at the ring's tail, unpublished.
func (b *BufRing) put(id uint16) {
	e := (*bufEntry)(unsafe.Pointer(&b.entMem[int(b.tail&b.mask)*int(unsafe.Sizeof(bufEntry{}))]))
	// The first entry's resv field is the ring's tail: leave it alone.
	e.addr = uint64(uintptr(unsafe.Pointer(&b.bufMem[int(id)*b.size])))
	e.len = uint32(b.size)
	e.bid = id
	b.tail++
}

// publish shows the kernel the buffers put since the last publish.
func (b *BufRing) publish() {
	// A store with release order: the entries are written before the tail moves. The
	// tail is a 16-bit field inside the first entry; Go has no 16-bit atomics, so the
	// 32-bit word holding it (bid and tail, little-endian: the build constraint) is
	// written whole, with the bid it holds.
	word := (*uint32)(unsafe.Pointer(&b.entMem[12]))
	bid := uint32(*(*uint16)(unsafe.Pointer(&b.entMem[12])))
	atomic.StoreUint32(word, bid|uint32(b.tail)<<16)
}

func (b *BufRing) unmap() {
	for _, m := range [][]byte{b.entMem, b.bufMem} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	b.entMem, b.bufMem = nil, nil
}
