package segment_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leafproxy/leafproxy/idgen/segment"
)

// How a program wires the engine to leaf_alloc. Metrics hang off Hooks.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	engine, err := segment.New(segment.Settings{
		Store: segment.NewPostgresStore(pool),
		Hooks: segment.Hooks{
			OnLoad: func(tag string, size int64, took time.Duration, err error) {
				// e.g. observe took in a histogram labelled with tag
			},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := engine.Start(startCtx); err != nil {
		log.Fatal(err)
	}
	defer engine.Close(context.Background())

	reqCtx, cancelReq := context.WithTimeout(ctx, time.Second)
	defer cancelReq()
	id, err := engine.Next(reqCtx, "order")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(id)
}
