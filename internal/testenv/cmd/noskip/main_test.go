package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestRelayPrintsLikeGoTestAndListsSkips(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"start","Package":"a"}`,
		`{"Action":"run","Package":"a","Test":"TestOne"}`,
		`{"Action":"output","Package":"a","Test":"TestOne","Output":"=== RUN   TestOne\n"}`,
		`{"Action":"start","Package":"b"}`,
		`{"Action":"output","Package":"b","Test":"TestTwo","Output":"--- SKIP: TestTwo\n"}`,
		`{"Action":"skip","Package":"b","Test":"TestTwo"}`,
		`{"Action":"output","Package":"a","Test":"TestOne","Output":"--- PASS: TestOne\n"}`,
		`{"Action":"pass","Package":"a","Test":"TestOne"}`,
		`{"Action":"output","Package":"a","Output":"PASS\n"}`,
		`{"Action":"output","Package":"a","Output":"ok  \ta\t0.1s\n"}`,
		`{"Action":"pass","Package":"a"}`,
		`# c: build failed`,
		`{"Action":"output","Package":"b","Output":"FAIL\tb\t0.1s\n"}`,
		`{"Action":"fail","Package":"b"}`,
		`{"Action":"output","Package":"d","Output":"?   \td\t[no test files]\n"}`,
		`{"Action":"skip","Package":"d"}`,
	}, "\n")
	var out strings.Builder
	skipped := relay(strings.NewReader(in), &out)
	if want := []string{"b TestTwo"}; !reflect.DeepEqual(skipped, want) {
		t.Errorf("skipped = %q, want %q", skipped, want)
	}
	want := "ok  \ta\t0.1s\n# c: build failed\n--- SKIP: TestTwo\nFAIL\tb\t0.1s\n?   \td\t[no test files]\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
