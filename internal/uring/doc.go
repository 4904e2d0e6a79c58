// Package uring is a minimal interface to Linux's io_uring for socket event loops: a
// submission and a completion ring shared with the kernel, a ring of provided receive
// buffers, and the few operations a relay needs (receive, send, poll, cancel).
//
// Why: on a virtual machine every system call pays for the switch between user and
// kernel space, a large share of a proxy's cost per message when messages are small. An
// event loop over epoll makes a wait, a receive and a send for each message it relays;
// over a ring the receives are done by the kernel as data arrives, and the sends are
// handed over in the same call that waits for the next completion.
//
// Conventions the package relies on, each checked by its tests against the running
// kernel:
//   - a send made with MSG_DONTWAIT completes during the call that submits it (all of it,
//     part of it, or -EAGAIN); it never goes on in the background, so its buffer is free
//     once Enter returns and its completion is already in the ring;
//   - so does a receive into a buffer of the caller's made with MSG_DONTWAIT (the bytes
//     at hand, 0 at the peer's close, or -EAGAIN on an empty socket);
//   - a receive on a socket with no data waits in the kernel, even on a non-blocking
//     socket, and completes with a buffer from the provided-buffer ring when data comes;
//   - a ring set up with SINGLE_ISSUER and DEFER_TASKRUN runs its completion work only
//     inside Enter, on the thread that created it: the caller keeps one locked OS thread
//     (runtime.LockOSThread) for the life of the ring.
package uring
