package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func rules(t *testing.T, origin string, raw ...string) []SourcedFillRule {
	t.Helper()
	var out []SourcedFillRule
	for _, s := range raw {
		r, err := ParseFillRule(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, SourcedFillRule{FillRule: r, Origin: origin})
	}
	return out
}

func TestMergeFillRules(t *testing.T) {
	cases := []struct {
		name          string
		config, store []string
		want          []string // merged rules in order, as String() writes them
		conflicts     []string // substrings of the error, one per conflict
	}{
		{name: "empty", want: []string{}},
		{name: "config only", config: []string{"orders.id=order"}, want: []string{"orders.id=order"}},
		{name: "store only", store: []string{"app.lines.id=line"}, want: []string{"app.lines.id=line"}},
		{name: "both, sorted", config: []string{"orders.id=order"}, store: []string{"app.lines.id=line", "items.item_id=item"},
			want: []string{"items.item_id=item", "orders.id=order", "app.lines.id=line"}},
		{name: "same rule twice counts once", config: []string{"orders.id=order"}, store: []string{"orders.id=order"},
			want: []string{"orders.id=order"}},
		{name: "schema-less and qualified are different tables", config: []string{"orders.id=order"}, store: []string{"public.orders.id=other"},
			want: []string{"orders.id=order", "public.orders.id=other"}},
		{name: "one column, two tags", config: []string{"orders.id=order"}, store: []string{"orders.id=other"},
			conflicts: []string{"orders.id is filled from two tags", "orders.id=order (config)", "orders.id=other (store)"}},
		{name: "one table, two key columns", config: []string{"orders.id=order"}, store: []string{"orders.order_no=order"},
			conflicts: []string{"table orders has two key columns", "orders.id=order (config)", "orders.order_no=order (store)"}},
		{name: "conflict within the store", store: []string{"a.id=x", "a.key=x"},
			conflicts: []string{"table a has two key columns"}},
		{name: "every conflict reported", config: []string{"a.id=x", "b.id=x"}, store: []string{"a.id=y", "b.key=x", "c.id=z"},
			conflicts: []string{"a.id is filled from two tags", "table b has two key columns"}},
		{name: "quoted names keep case", config: []string{`"Orders".id=order`}, store: []string{"orders.id=other"},
			want: []string{`"Orders".id=order`, "orders.id=other"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := MergeFillRules(rules(t, "config", c.config...), rules(t, "store", c.store...))
			if len(c.conflicts) > 0 {
				if !errors.Is(err, ErrFillConflict) || got != nil {
					t.Fatalf("got %v, %v; want no rules and ErrFillConflict", got, err)
				}
				for _, s := range c.conflicts {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not say %q", err, s)
					}
				}
				if n := strings.Count(err.Error(), ErrFillConflict.Error()); n != len(c.conflicts) && c.name == "every conflict reported" {
					t.Errorf("error reports %d conflicts, want %d: %v", n, len(c.conflicts), err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			names := []string{}
			for _, r := range got {
				names = append(names, r.String())
			}
			if !reflect.DeepEqual(names, c.want) {
				t.Fatalf("merged %q, want %q", names, c.want)
			}
		})
	}
}

func TestFillRuleStoreRoundTrip(t *testing.T) {
	for _, s := range []string{"orders.id=o", "app.orders.id=o", `"Order Lines".id=l`, `s."a.b"."Key""x"=k`, "t1.c$2=x"} {
		r, err := ParseFillRule(s)
		if err != nil {
			t.Fatal(err)
		}
		back, err := FillRuleFromStore(r.SQLTable(), r.SQLColumn(), r.Tag)
		if err != nil || back != r {
			t.Fatalf("%s: stored as (%s, %s), read back %+v, %v; want %+v", s, r.SQLTable(), r.SQLColumn(), back, err, r)
		}
		target, err := ParseFillTarget(r.SQLTable() + "." + r.SQLColumn())
		if r.Tag = ""; err != nil || target != r {
			t.Fatalf("%s: target %+v, %v; want %+v", s, target, err, r)
		}
	}
	for _, bad := range []string{"orders", "a.b.c.d", `"x.id`, "a..b"} {
		if _, err := ParseFillTarget(bad); err == nil {
			t.Errorf("ParseFillTarget(%q) succeeded", bad)
		}
	}
}
