package pool

import "time"

// waiter is one Acquire waiting for a connection. Its fields are guarded by the Pool's
// lock until finish, after which only its Acquire reads them.
type waiter[C any] struct {
	prev, next *waiter[C]
	since      instant
	timeout    time.Duration                     // QueryWaitTimeout when the wait began; 0 for none
	ready      chan struct{}                     // receives one value at finish; nil for a wait of AcquireFunc
	notify     func(*Wait[C], *Server[C], error) // AcquireFunc's done; nil for Acquire
	wait       *Wait[C]                          // AcquireFunc's wait, which holds this waiter
	kp         *keyPool[C]                       // the key's pool, whose queue it joined
	done       bool
	srv        *Server[C]
	err        error
}

func (w *waiter[C]) finish(s *Server[C], err error) {
	w.done = true
	if w.notify != nil {
		w.notify(w.wait, s, err)
		return
	}
	w.srv, w.err = s, err
	w.ready <- struct{}{}
}

// waitQueue is a FIFO of waiters, linked through the waiters themselves so that a
// cancelled or expired waiter leaves from the middle in constant time.
type waitQueue[C any] struct {
	head, tail *waiter[C]
	n          int
}

func (q *waitQueue[C]) push(w *waiter[C]) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n++
}

func (q *waitQueue[C]) pop() *waiter[C] {
	w := q.head
	if w != nil {
		q.remove(w)
	}
	return w
}

func (q *waitQueue[C]) remove(w *waiter[C]) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	q.n--
}

// Wait is a wait of AcquireFunc for a connection, which CancelWait may end.
type Wait[C any] struct{ w waiter[C] }
