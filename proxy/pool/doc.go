// Package pool lends server connections to client sessions, one pool per database and
// user, so that many clients share few PostgreSQL backends (transaction pooling, as
// PgBouncer's pool_mode=transaction, and session pooling).
//
// # Words
//
//   - key: the (database, user) pair a server connection logged in as. Connections of one
//     key are interchangeable; each key has its own pool, and the pools of one database
//     share max-db-connections.
//   - server connection: a connection to PostgreSQL, of whatever type C the session uses.
//     The pool never reads or writes it: a Connector supplied by the session dials,
//     resets and closes it.
//   - borrow: Acquire lends a connection of a key. In transaction mode the session borrows
//     at the first message of a transaction (or of a statement outside one); in session
//     mode, at login.
//   - give back: Server.Release, at ReadyForQuery with status I in transaction mode, at
//     the end of the client's session in session mode. The borrower says in which State
//     it leaves the connection:
//   - clean: nothing a later borrower could see is left on the connection; it is lent
//     again as it is.
//   - reset: the connection holds session state (SETs, prepared statements, temp tables)
//     and is run through Connector.Reset (DISCARD ALL, as PgBouncer's server_reset_query)
//     before anyone else borrows it; while that runs it is "used" in the Stats.
//   - broken: the connection is in an unknown state (lost or failed mid-transaction, a
//     protocol error, a client gone mid-transaction that could not be rolled back); it is
//     closed and never lent again.
//
// # Guarantees
//
//   - A key never has more than pool-size connections open, being dialled or being
//     closed, and a database never more than max-db-connections over its users: a closed
//     connection counts until Connector.Close returns.
//   - A connection is lent to one borrower at a time, and one given back broken, or
//     whose reset failed, is never lent again.
//   - Waiting borrowers of a key are served in the order they arrived; a connection
//     given back goes straight to the one that has waited longest.
//   - A wait ends with the borrower's context, or after query-wait-timeout with
//     ErrWaitTimeout, SQLSTATE 57014 (see CodeWaitTimeout for why not PgBouncer's 08P01).
//   - When a dial fails, every waiter of the key fails at once with ErrServerDown wrapping
//     the dial's error (SQLSTATE 08001, or the server's own, such as 57P03); for a pause
//     that starts at 250 ms and doubles up to server-login-retry, borrowers of a key with
//     no connection at all fail at once without a new dial, so a down server is neither
//     waited for nor hammered.
//   - A connection in use is never closed by the pool: server-lifetime, a smaller
//     pool-size after Reload and Shutdown take effect when it is given back.
//
// # The janitor
//
// Every janitor interval the pool closes idle connections past server-lifetime, and
// past server-idle-timeout while the key keeps min-pool-size, and dials what a key lacks
// of min-pool-size. A key's pool exists from its first Acquire; the janitor forgets it
// once it holds no connection, no borrower and no recent dial failure, so that a Pool
// serving many users does not keep them all (its figures leave the Snapshot then).
// Timers run on a clock that unit tests replace.
//
// # Files
//
//   - pool.go: Pool, Acquire and Release, the hand-over to waiters, dials and resets.
//   - waiters.go: the FIFO of waiting borrowers.
//   - janitor.go: the janitor, Reload, Shutdown and Close.
//   - settings.go: Settings and Limits, their defaults (PgBouncer's) and validation.
//   - errors.go: the sentinel errors and the SQLSTATEs they carry.
//   - stats.go: Snapshot (the figures of PgBouncer's SHOW POOLS) and a Prometheus
//     collector.
//   - clock.go: the clock the timers run on.
package pool
