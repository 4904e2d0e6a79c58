// Package proxy is leafproxy's PostgreSQL wire-protocol server in session mode: every client
// connection gets its own upstream connection, held until the client leaves.
//
// The proxy is invisible to clients: startup parameters and authentication (trust, md5,
// SCRAM-SHA-256) are relayed so that the database alone decides who gets in, and every
// message the proxy does not act on crosses it as raw bytes, in order, batched into as few
// writes as the traffic allows. Cancel requests reach the upstream backend the client was
// told about. The proxy decodes only the few message types it must inspect: ReadyForQuery
// (transaction status), BackendKeyData (cancel keys), ErrorResponse (to see a FATAL) and
// the authentication requests (to know when the client answers).
//
// SCRAM channel binding (SCRAM-SHA-256-PLUS) binds the client's authentication to the
// certificate of the server it talks TLS with. Through the proxy that is the proxy's
// certificate, so binding only succeeds when the proxy presents the database's own
// certificate and key; otherwise a TLS client must connect with channel_binding=disable.
//
// A Server is configured through exported fields, like net/http.Server, and stopped with
// Shutdown (graceful) or Close.
package proxy
