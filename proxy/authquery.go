package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/proxy/pgauth"
)

// querySecret runs the auth query for user on the upstream, logged in as the auth user in
// database, the way PgBouncer's auth_query works. It returns nil when the query finds no
// row or a NULL secret.
func (c *conn) querySecret(a *ClientAuth, user, database string) (*pgauth.Secret, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.srv.startupTimeout())
	defer cancel()
	nc, err := c.srv.dialUpstream(ctx, c.upstreamAddr)
	if err != nil {
		return nil, fmt.Errorf("connecting to the upstream: %w", err)
	}
	defer nc.Close()
	dl, _ := ctx.Deadline()
	_ = nc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	login := &pgauth.Login{User: a.User}
	if a.Password != "" {
		login.Secret = &pgauth.Secret{Kind: pgauth.Plain, Password: a.Password}
	} else if login.Secret, err = a.fileSecret(a.User); err != nil {
		return nil, err
	}
	q := &queryConn{nc: nc, r: msgReader{br: bufio.NewReader(nc), maxBody: c.srv.maxMessageSize()},
		w: bufio.NewWriter(nc)}
	if err := q.login(login, database); err != nil {
		return nil, fmt.Errorf("logging in as auth user %q: %w", a.User, err)
	}
	secret, err := q.lookup(a.query(), user)
	if err != nil {
		return nil, fmt.Errorf("auth query as %q: %w", a.User, err)
	}
	_ = q.send(&pgproto3.Terminate{})
	return secret, nil
}

// queryConn is the proxy's own short connection to the upstream for the auth query.
type queryConn struct {
	nc net.Conn
	r  msgReader
	w  *bufio.Writer
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

// lookup runs query with user as $1 and returns the secret of the row it finds.
func (q *queryConn) lookup(query, user string) (*pgauth.Secret, error) {
	err := q.send(
		&pgproto3.Parse{Query: query},
		&pgproto3.Bind{Parameters: [][]byte{[]byte(user)}},
		&pgproto3.Execute{},
		&pgproto3.Sync{},
	)
	if err != nil {
		return nil, err
	}
	var secret *pgauth.Secret
	var failed error
	rows := 0
	for {
		typ, n, err := q.r.next()
		if err != nil {
			return nil, err
		}
		body, err := q.r.readBody(n)
		if err != nil {
			return nil, err
		}
		switch typ {
		case serverDataRow:
			rows++
			cols, err := dataRow(body)
			if err != nil {
				return nil, err
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
			if failed != nil {
				return nil, failed
			}
			if rows > 1 {
				return nil, fmt.Errorf("the auth query returns %d rows for one user", rows)
			}
			return secret, nil
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
