package pgbench

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	out := `transaction type: <builtin: select only>
number of transactions actually processed: 51234
number of failed transactions: 3 (0.006%)
latency average = 0.156 ms
initial connection time = 4.502 ms
tps = 5123.456789 (without initial connection time)
`
	r, err := parse(out, "proxy", "simple", 8)
	if err != nil {
		t.Fatal(err)
	}
	if r.TPS != 5123.456789 || r.Failed != 3 || r.Endpoint != "proxy" || r.Clients != 8 {
		t.Fatalf("parsed %+v", r)
	}
	if _, err := parse("pgbench: error: connection refused", "proxy", "simple", 1); err == nil {
		t.Fatal("no error for output without tps")
	}
}

func TestMedianAndTable(t *testing.T) {
	m := median([]Result{{TPS: 30, Failed: 1}, {TPS: 10}, {TPS: 20, Failed: 2}})
	if m.TPS != 20 || m.Failed != 3 {
		t.Fatalf("median %+v", m)
	}
	groups := []Group{{Name: "select-only", Endpoints: []Endpoint{{Name: "direct"}, {Name: "proxy"}}}}
	results := []Result{
		{Group: "select-only", Endpoint: "direct", Mode: "simple", Clients: 8, TPS: 1000},
		{Group: "select-only", Endpoint: "proxy", Mode: "simple", Clients: 8, TPS: 900},
	}
	table := Table(groups, results)
	for _, want := range []string{"| select-only | mode | clients | direct TPS | proxy TPS | proxy / direct |", "| | simple | 8 | 1000 | 900 | 0.90× |"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}
