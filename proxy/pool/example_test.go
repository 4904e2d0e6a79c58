package pool_test

import (
	"context"
	"fmt"

	"github.com/leafproxy/leafproxy/proxy/pool"
)

// backend stands for a server connection; a session would use its own type, wrapping a
// net.Conn logged in to PostgreSQL.
type backend struct {
	id      int
	session []string
}

type connector struct{ dialled int }

func (c *connector) Dial(ctx context.Context, key pool.Key) (*backend, error) {
	c.dialled++
	return &backend{id: c.dialled}, nil
}

func (c *connector) Reset(ctx context.Context, b *backend) error {
	b.session = nil // DISCARD ALL
	return nil
}

func (c *connector) Close(b *backend) {}

// A session borrows a connection at the first message of a transaction and gives it back
// at ReadyForQuery: clean after a transaction (transaction mode), for a reset after
// session state (session mode), broken after an error that leaves it in doubt.
func Example() {
	p, err := pool.New[*backend](&connector{}, pool.Settings{Limits: pool.Limits{PoolSize: 5}})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	ctx := context.Background()
	key := pool.Key{Database: "app", User: "alice"}

	s, err := p.Acquire(ctx, key) // BEGIN arrives
	if err != nil {
		panic(err) // a *pool.Error: answer the client with its SQLState()
	}
	s.CountTransaction(3)
	s.Release(pool.Clean) // ReadyForQuery 'I'

	s, _ = p.Acquire(ctx, key)
	s.Conn().session = append(s.Conn().session, "SET search_path = other")
	s.Release(pool.NeedsReset)

	s, _ = p.Acquire(ctx, key)
	fmt.Println("connection", s.Conn().id, "session state", s.Conn().session)
	s.Release(pool.Broken) // say, the server went away mid-transaction

	st := p.Snapshot()[0]
	fmt.Println("acquires", st.Acquires, "transactions", st.Transactions)
	// Output:
	// connection 1 session state []
	// acquires 3 transactions 1
}
