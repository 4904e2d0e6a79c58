package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/proxy/pgauth"
)

// querySecret runs the auth query for user on the upstream, logged in as the auth user in
// database, the way PgBouncer's auth_query works. It returns nil when the query finds no
// row or a NULL secret.
//
// The query runs on a connection kept from an earlier login when there is one (see
// authConns), so that a login costs one round trip and not a connection, a login of the
// auth user and a backend started on the database. Nothing else is kept: the secret is
// read for every login, so that a changed or removed password takes effect at once.
func (c *conn) querySecret(a *ClientAuth, user, database string) (*pgauth.Secret, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.srv.startupTimeout())
	defer cancel()
	target := authTarget{addr: c.upstreamAddr, database: database}
	for {
		q := c.srv.authConns.take(target)
		reused := q != nil
		if !reused {
			var err error
			if q, err = c.dialAuthQuery(ctx, a, database); err != nil {
				return nil, err
			}
		}
		secret, usable, err := q.run(ctx, a.query(), user)
		if usable {
			c.srv.authConns.put(target, q)
		} else {
			q.nc.Close()
		}
		if err != nil && reused && !usable && ctx.Err() == nil {
			// The server may have closed the connection while it was idle (a restart,
			// idle_session_timeout): once more, on a new one.
			c.log.WithError(err).Debug("auth query connection lost; dialling a new one")
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("auth query as %q: %w", a.User, err)
		}
		return secret, nil
	}
}

// dialAuthQuery opens a connection to the upstream logged in as the auth user in
// database.
func (c *conn) dialAuthQuery(ctx context.Context, a *ClientAuth, database string) (*queryConn, error) {
	nc, err := c.srv.dialUpstream(ctx, c.upstreamAddr)
	if err != nil {
		return nil, fmt.Errorf("connecting to the upstream: %w", err)
	}
	login := &pgauth.Login{User: a.User}
	if a.Password != "" {
		login.Secret = &pgauth.Secret{Kind: pgauth.Plain, Password: a.Password}
	} else if login.Secret, err = a.fileSecret(a.User); err != nil {
		nc.Close()
		return nil, err
	}
	q := &queryConn{nc: nc, r: msgReader{br: bufio.NewReader(nc), maxBody: c.srv.maxMessageSize()},
		w: bufio.NewWriter(nc)}
	err = q.withDeadline(ctx, func() error { return q.login(login, database) })
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("logging in as auth user %q: %w", a.User, err)
	}
	return q, nil
}

// run runs the auth query for user under ctx's deadline. usable says the connection is
// ready for the next query (the server answered up to ReadyForQuery, an error of the
// query's included).
func (q *queryConn) run(ctx context.Context, query, user string) (secret *pgauth.Secret, usable bool, err error) {
	var failed error
	err = q.withDeadline(ctx, func() error {
		secret, failed, err = q.lookup(query, user)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return secret, true, failed
}

// withDeadline runs f with ctx's deadline, and ctx's end, on the connection.
func (q *queryConn) withDeadline(ctx context.Context, f func() error) error {
	dl, _ := ctx.Deadline()
	_ = q.nc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = q.nc.SetDeadline(time.Unix(1, 0)) })
	err := f()
	if !stop() {
		return errors.Join(err, ctx.Err())
	}
	if err == nil {
		err = q.nc.SetDeadline(noDeadline)
	}
	return err
}

// authConns keeps idle the connections the auth query ran on, a few per upstream and
// database, for the next logins. PgBouncer, too, runs auth_query on a pooled connection
// of auth_user rather than on one of its own per login.
type authConns struct {
	mu     sync.Mutex
	idle   map[authTarget][]*queryConn
	closed bool
}

// authTarget is where auth queries run: an upstream address and a database there.
type authTarget struct{ addr, database string }

// Bounds of authConns: the idle connections kept per target, and how long one may have
// been idle to be used again (older ones are closed, lest the server or a firewall has
// dropped them meanwhile).
const (
	maxIdleAuthConns = 4
	authConnMaxIdle  = time.Minute
)

// take returns an idle connection for target, nil when there is none.
func (p *authConns) take(target authTarget) *queryConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for conns := p.idle[target]; len(conns) > 0; conns = p.idle[target] {
		q := conns[len(conns)-1]
		p.idle[target] = conns[:len(conns)-1]
		if time.Since(q.idleSince) < authConnMaxIdle {
			return q
		}
		q.nc.Close()
	}
	return nil
}

// put keeps q idle for target, or closes it when enough are kept or the server has closed.
func (p *authConns) put(target authTarget, q *queryConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle[target]) >= maxIdleAuthConns {
		q.nc.Close()
		return
	}
	if p.idle == nil {
		p.idle = make(map[authTarget][]*queryConn)
	}
	q.idleSince = time.Now()
	p.idle[target] = append(p.idle[target], q)
}

// close closes the idle connections and every one put back later.
func (p *authConns) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for target, conns := range p.idle {
		for _, q := range conns {
			_ = q.send(&pgproto3.Terminate{})
			q.nc.Close()
		}
		delete(p.idle, target)
	}
}

// queryConn is the proxy's own connection to the upstream for the auth query.
type queryConn struct {
	nc        net.Conn
	r         msgReader
	w         *bufio.Writer
	idleSince time.Time // when it was last put back (authConns)
}

func (q *queryConn) send(msgs ...pgproto3.FrontendMessage) error {
	var buf []byte
	for _, m := range msgs {
		var err error
		if buf, err = m.Encode(buf); err != nil {
			return err
		}
	}
	if _, err := q.w.Write(buf); err != nil {
		return err
	}
	return q.w.Flush()
}

// serverError turns an ErrorResponse body into an error.
func serverError(body []byte) error {
	var e pgproto3.ErrorResponse
	if err := e.Decode(body); err != nil {
		return err
	}
	return fmt.Errorf("%s: %s (SQLSTATE %s)", e.Severity, e.Message, e.Code)
}

func (q *queryConn) login(l *pgauth.Login, database string) error {
	l.Binding, l.TLS = connBinding(q.nc)
	err := q.send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": l.User, "database": database, "application_name": "leafproxy auth query"}})
	if err != nil {
		return err
	}
	for {
		typ, n, err := q.r.next()
		if err != nil {
			return err
		}
		body, err := q.r.readBody(n)
		if err != nil {
			return err
		}
		switch typ {
		case serverAuthentication:
			resp, err := l.Respond(body)
			if err != nil {
				return err
			}
			if resp != nil {
				if err := writeHeader(q.w, clientPassword, len(resp)); err != nil {
					return err
				}
				if _, err := q.w.Write(resp); err != nil {
					return err
				}
				if err := q.w.Flush(); err != nil {
					return err
				}
			}
		case serverErrorResponse:
			return serverError(body)
		case serverReadyForQuery:
			return nil
		}
	}
}

// lookup runs query with user as $1 and returns the secret of the row it finds; failed
// is the query's own failure (an ErrorResponse, a result of the wrong shape), after which
// the connection is ready for the next query, err one of the connection.
func (q *queryConn) lookup(query, user string) (secret *pgauth.Secret, failed, err error) {
	err = q.send(
		&pgproto3.Parse{Query: query},
		&pgproto3.Bind{Parameters: [][]byte{[]byte(user)}},
		&pgproto3.Execute{},
		&pgproto3.Sync{},
	)
	if err != nil {
		return nil, nil, err
	}
	rows := 0
	for {
		typ, n, err := q.r.next()
		if err != nil {
			return nil, nil, err
		}
		body, err := q.r.readBody(n)
		if err != nil {
			return nil, nil, err
		}
		switch typ {
		case serverDataRow:
			rows++
			cols, err := dataRow(body)
			if err != nil {
				return nil, nil, err
			}
			if len(cols) != 2 {
				failed = fmt.Errorf("the auth query returns %d columns, want 2 (name, secret)", len(cols))
				continue
			}
			if cols[1] != nil {
				s := pgauth.ParseSecret(string(cols[1]))
				secret = &s
			}
		case serverErrorResponse:
			failed = serverError(body)
		case serverReadyForQuery:
			if failed == nil && rows > 1 {
				failed = fmt.Errorf("the auth query returns %d rows for one user", rows)
			}
			if failed != nil {
				return nil, failed, nil
			}
			return secret, nil, nil
		}
	}
}

// dataRow splits a DataRow body into its column values (nil for NULL).
func dataRow(body []byte) ([][]byte, error) {
	if len(body) < 2 {
		return nil, errors.New("short DataRow")
	}
	n := int(binary.BigEndian.Uint16(body))
	body = body[2:]
	cols := make([][]byte, n)
	for i := range cols {
		if len(body) < 4 {
			return nil, errors.New("short DataRow")
		}
		l := int32(binary.BigEndian.Uint32(body))
		body = body[4:]
		if l < 0 {
			continue
		}
		if int(l) > len(body) {
			return nil, errors.New("short DataRow")
		}
		cols[i] = body[:l]
		body = body[l:]
	}
	return cols, nil
}
