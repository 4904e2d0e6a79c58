package snowflake_test

import (
	"context"
	"fmt"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker"
)

func Example() {
	ctx := context.Background()
	e, err := snowflake.New(snowflake.Settings{Source: worker.Static{ID: 42}})
	if err != nil {
		panic(err)
	}
	if err := e.Start(ctx); err != nil {
		panic(err)
	}
	defer e.Close(ctx)

	a, _ := e.Next(ctx, "")
	b, _ := e.Next(ctx, "")
	p := e.Decompose(b)
	fmt.Println(b > a, p.Worker, e.Info().Layout)
	// Output: true 42 41/10/12
}
