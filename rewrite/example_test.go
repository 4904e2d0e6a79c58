package rewrite_test

import (
	"fmt"

	"github.com/leafproxy/leafproxy/rewrite"
)

func ExampleRewriter_Plan() {
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders", Column: "id", Tag: "order"}}})
	if err != nil {
		panic(err)
	}
	plan, err := rw.Plan("INSERT INTO orders (item) VALUES ('book'), ('pen') RETURNING id")
	if err != nil {
		panic(err)
	}
	fmt.Println(plan.Slots)
	fmt.Println(string(plan.AppendLiteral(nil, []int64{1001, 1002})))
	fmt.Println(string(plan.AppendParams(nil, plan.MaxParam+1)))

	_, err = rw.Plan("UPDATE orders SET id = leaf_next('order')")
	fmt.Println(err.(*rewrite.Error).SQLState())
	// Output:
	// [tag:order tag:order]
	// INSERT INTO orders (item, id) VALUES ('book', 1001::int8), ('pen', 1002::int8) RETURNING id
	// INSERT INTO orders (item, id) VALUES ('book', $1), ('pen', $2) RETURNING id
	// 0A000
}
