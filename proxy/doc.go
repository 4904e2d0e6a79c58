// Package proxy is leafproxy's PostgreSQL wire-protocol server in session mode: every client
// connection gets its own upstream connection, held until the client leaves.
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
package proxy
