// Package proxy is leafproxy's PostgreSQL wire-protocol server. In session mode (the
// default) every client connection (a session) gets its own server connection, held until
// the client leaves (and then, when the proxy authenticated the client, reset and kept for
// the next session of the same startup; see sessionreuse.go); in transaction mode sessions
// share pools of server connections, one borrowed per transaction (see txsession.go).
//
// The proxy is invisible to clients: startup parameters and authentication (trust, md5,
// SCRAM-SHA-256) are relayed so that the database alone decides who gets in, and every
// message the proxy does not act on crosses it as raw bytes, in order, batched into as few
// writes as the traffic allows (a buffer is flushed when the other side has nothing more
// buffered). Cancel requests reach the upstream backend the client was told about: clients
// receive the backend's own BackendKeyData, and the proxy forwards only cancels for keys
// it handed out; a cancel for a session that waits for an ID also ends that wait, and the
// statement fails with 57014 (see cancel.go). Without a Rewriter the proxy decodes only ReadyForQuery (transaction
// status), BackendKeyData, ErrorResponse (to see a FATAL) and the authentication requests
// (to know when the client answers).
//
// With a Rewriter, Query, Parse, Bind, Describe and Close are decoded too, and statements
// whose plan needs IDs are rewritten: a Query gets literal IDs; a Parse gets hidden
// trailing int8 parameters, which every Bind of the statement fills with fresh IDs, and
// which are stripped from the statement's ParameterDescription; SQL-level PREPARE and
// EXECUTE get the same treatment. A standalone SELECT leaf_next('tag') or
// leaf_snowflake() is answered by the proxy itself when nothing is outstanding: as a
// Query, and in the extended protocol as a whole cycle up to Sync outside a transaction
// block (see local.go; a cycle that turns out to need the server is replayed upstream,
// and an unnamed statement parsed by the proxy is created at the server first).
// SELECT leaf_next('tag', n) is answered the same way, n rows, and elsewhere becomes
// SELECT unnest(<IDs>::int8[]) with the IDs a literal or one hidden int8[] parameter
// (batch.go). SELECT leaf_decode(id) is answered alike when the proxy can print the
// timestamp as the server would, and elsewhere becomes SQL that splits the ID; Bind
// checks a parameter ID (decode.go). A COPY … FROM STDIN into a filled table gets a key in every
// row of its data stream: binary tuples in copyfill.go, text and CSV rows, found by
// PostgreSQL's own rules, in copytext.go.
//
// A statement the proxy refuses (the rewriter cannot rewrite it safely, or its IDs cannot
// be had) never reaches the database: a stand-in that fails before doing anything goes
// upstream in its place (see refusal.go), so that the server's transaction fails where
// PostgreSQL's would have (a transaction block is aborted, a savepoint can recover it),
// and the client gets the proxy's error where the server's for the stand-in would have
// been, with the server's ReadyForQuery, in exact order under pipelining. After a refusal
// in the extended protocol the proxy, like the server, ignores messages until Sync.
//
// Known limits: when the server does not create an unnamed statement the proxy parsed
// itself (an error earlier in the cycle), a cycle the client pipelined behind that one,
// sent before the failure was known, may get 26000 (no such statement) for it. A Query
// string of several statements refused for what it holds as a whole (a PREPARE with
// hidden parameters among other statements, an EXECUTE or DEALLOCATE of a statement with
// hidden parameters) fails before any of its statements runs. GSSAPI authentication and
// GSSAPI encryption are not relayed. SCRAM channel binding (SCRAM-SHA-256-PLUS) binds the
// authentication to the certificate of the server the client talks TLS with, which is
// the proxy: it only succeeds when the proxy presents the database's own certificate and
// key, and the proxy offers SCRAM-SHA-256-PLUS only then (auth.go); a TLS client that
// would bind if offered is refused with 28000 and told to use channel_binding=disable.
//
// A Server is configured through exported fields, like net/http.Server, and stopped with
// Shutdown (graceful) or Close.
//
// # Words
//
//   - session: one client connection from its startup packet to its end, with what the
//     proxy keeps of the client's side of the protocol (type conn): messages the client
//     still awaits, the rewriting bookkeeping, the cancel key the client was given.
//   - server connection: one connection to the database server (type serverConn): its
//     socket, reader and writer, and what the server reports on it (transaction status,
//     ParameterStatus values, BackendKeyData). A session holds one; nothing the server
//     connection knows lives in the session, so that it could be given back.
//   - engine: what runs a session's handlers over its sockets, one message at a time: a
//     goroutine pair (one goroutine per direction) or an event loop (many sessions on one
//     goroutine, over epoll). Both drive the same handlers, clientStep and upstreamStep.
//   - cycle: a request cycle, a Query or the extended-protocol messages up to a Sync,
//     which the server ends with one ReadyForQuery.
//   - fast path: a standalone SELECT leaf_next('tag') or leaf_snowflake() (and the batch
//     and leaf_decode forms) answered by the proxy itself, without the server.
//   - local cycle, materialize: an extended-protocol cycle the proxy answers itself; a
//     statement the proxy parsed locally is materialized when it must exist at the server
//     after all (its Parse is sent there, and the server's ParseComplete is swallowed).
//   - swallow: drop a response of the server that the client must not see, because the
//     proxy already answered for it.
//   - stand-in: the harmless statement that fails at the server in place of one the proxy
//     refused, so that the server's transaction fails where PostgreSQL's would have.
//   - detach: a handler on an event loop that must block (waiting for an ID, planning a
//     long text) leaves the loop to a new goroutine and takes the session back when done.
//   - hand-off: an event loop gives a session to a goroutine pair for good, for a message
//     larger than a loop holds.
//   - adopt: an event loop takes over an established session from the goroutine that
//     started it.
//   - drain: at the end of a session after a protocol error, stop writing to the client
//     and read what it still sends until it closes, so that the error is not lost to a
//     connection reset.
//
// # Files
//
// Sessions and their engines:
//
//   - server.go: Server, its listeners, the goroutines that serve new connections,
//     session slots, Shutdown and Close.
//   - conn.go: the session (conn): startup negotiation, TLS with the client, connecting
//     its server connection, close.
//   - serverconn.go: the server connection (serverConn).
//   - sessionpool.go: session mode's pool (sessionPool) for the sessions the proxy
//     authenticated: pool-size and max-db-connections counted over the sessions'
//     connections and the idle ones, the wait for room, the idle connections;
//     sessionpoolstats.go: its figures per (database, user) for /pools.
//   - sessionreuse.go: session mode's server connections given to later sessions: the
//     end of a session its client left idle, DISCARD ALL, the startup answered from an
//     idle connection; socketquiet_unix.go: whether an idle connection's socket is still
//     quiet, and whether a waiting client closed its socket; fdconn_linux.go: the socket
//     of one an event loop gave up (fdConn), outside the runtime's poller, with blocking
//     I/O in poll(2).
//   - upstream.go: dialing the server, upstream TLS and SSLMode.
//   - tlstransport.go: the socket under a TLS connection, movable between engines.
//   - auth.go: relaying authentication and the rest of the startup.
//   - engine.go: the engine interface and what a session does once under any engine:
//     close when idle, drain, panic recovery, the locks of its state (sessionLock); and
//     the goroutine pair's engine.
//   - relay.go: the handlers of one message from either side (clientStep, upstreamStep)
//     when the proxy only passes messages on, the pass (passClientRun, passUpstreamRun)
//     by which a loop relays a run of messages that need no handler in one write, with
//     the handlers' bookkeeping, and the end of either side.
//   - loop_linux.go: the event loops: epoll sets, their goroutines, posting work to them.
//   - loopsession_linux.go: a session on an event loop (loopSession, the loop's engine):
//     adopt, reading whole messages, the run that goes out last in a turn (writeOut),
//     streaming large rows, finish, detach and reattach.
//   - loopio_linux.go: non-blocking socket I/O for loops, and the hand-off to goroutines.
//   - sendbatch_linux.go: the last writes of a loop's turn, sent together over io_uring
//     (sendbatch_other.go: elsewhere, each goes at once).
//   - recvbatch_linux.go: the sockets a loop's wait reported readable, received together
//     over the same ring, their bytes held for their sessions' readers.
//   - loop_other.go: no event loops where epoll is missing.
//   - wire.go: reading and writing protocol messages; buffer sizes and limits.
//   - msgtypes.go: the named message types (clientQuery, serverReadyForQuery, …) and
//     transaction statuses.
//   - encode.go: the server messages the proxy writes itself, appended without
//     allocating.
//   - cancel.go: CancelRequest: the registry of keys handed out, forwarding upstream.
//
// Transaction mode (the session's route, its user or Server.PoolMode says
// PoolTransaction; see route.go): a session's server connection is a pooledConn, which
// borrows a connection of proxy/pool per transaction:
//
//   - pooled.go: PoolMode, the Server's pool and its Connector: the pooled connections
//     (physConn), their logins, reset and close.
//   - txsession.go: the server side of a session in transaction mode (pooledConn):
//     borrowing and giving back, waiting for a connection, ending.
//   - txwrite.go: the session's messages to the borrowed connection, each looked at once:
//     the client's statements prepared on each connection under names of the proxy's;
//     what goes as it is is written from the session's buffer, uncopied.
//   - txread.go: the borrowed connection's messages to the session, handled where the
//     connection's buffer holds them and put straight into the session's reader.
//   - txsettings.go: the client's settings carried from connection to connection.
//   - txstartup.go: the startup of a session in transaction mode (servePooled), answered
//     with the ParameterStatus values of the pool's newest login (welcome).
//   - txrefusal.go: what transaction mode refuses with 0A000.
//   - txlocal.go: what transaction mode answers without the database: refusals outside a
//     transaction, SQL-level DEALLOCATE.
//   - txcustom.go: custom settings (SET app.x), whose names pg_settings does not list.
//   - txstmts.go: the statements kept prepared on a server connection, least recently
//     used first (max-prepared-statements), and DEALLOCATE in the extended protocol.
//   - txloop_linux.go: sessions in transaction mode on the event loops: the borrowed
//     connection's socket watched by the session's loop, borrows that never block a
//     loop (pool.AcquireFunc), buffers given back while quiet.
//   - physio_linux.go: a pooled connection's socket outside the runtime's poller (physIO),
//     non-blocking for a loop session, blocking (poll) for everyone else; a connection
//     given back clean stays in its loop's epoll set (park), so that the loop's next
//     borrower takes it without an epoll_ctl.
//   - park.go, park_linux.go: parking idle sessions served by goroutine pairs
//     (event-loops -1, or no epoll): their goroutines end and their buffers are given
//     back, and the parking lot's epoll set watches their client sockets until they are
//     readable.
//
// Rewriting (Server.Rewriter set):
//
//   - rewriting.go: client messages of the rewriting proxy: Query, Describe, Close, the
//     fast path of a Query.
//   - extended.go: Parse and Bind, hidden parameters.
//   - responses.go: server messages of the rewriting proxy: the cycles settle, hidden
//     parameters are stripped, the proxy's own errors placed.
//   - cycles.go: the rewriting bookkeeping of a session: prepared statements with hidden
//     parameters, request cycles and their undo log.
//   - local.go: local cycles, answered by the proxy, and materialization.
//   - refusal.go: refused statements, their stand-ins and the proxy's errors.
//   - ids.go: the ID source (IDSource, IDProber) and waiting for an ID.
//   - batch.go: SELECT leaf_next('tag', n).
//   - decode.go: SELECT leaf_decode(id).
//   - copyfill.go: keys in the rows of a binary COPY FROM STDIN; copytext.go: in text and
//     CSV rows, and the ParameterStatus values they depend on.
//   - swap.go: replacing the Rewriter of a running server.
package proxy
