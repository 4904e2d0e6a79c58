package proxy

import (
	"bytes"
	"strings"
	"testing"

	"github.com/leafproxy/leafproxy/rewrite"
)

// textFill runs a text or CSV filler over the stream cut into the given pieces; IDs come
// from a counter starting at 101.
func textFill(t testing.TB, format rewrite.CopyFormat, columns []string, pieces ...[]byte) string {
	t.Helper()
	fill := &rewrite.CopyFill{Format: format, Columns: columns}
	for range columns {
		fill.Keys = append(fill.Keys, rewrite.Slot{Kind: rewrite.SlotTag, Tag: "order"})
	}
	n := int64(100)
	f := newTextFiller(fill, func(rewrite.Slot) (int64, error) { n++; return n, nil })
	var out []byte
	for _, p := range pieces {
		var err error
		if out, err = f.feed(out, p); err != nil {
			t.Fatal(err)
		}
	}
	out, err := f.finish(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

var (
	textFormat = rewrite.CopyFormat{Kind: "text", Delimiter: '\t', Quote: '"', Escape: '"'}
	csvFormat  = rewrite.CopyFormat{Kind: "csv", Delimiter: ',', Quote: '"', Escape: '"'}
)

func with(f rewrite.CopyFormat, change func(*rewrite.CopyFormat)) rewrite.CopyFormat {
	change(&f)
	return f
}

// textFillCases are streams with the row boundaries PostgreSQL finds in them, and the
// stream the proxy must send for them (one key, IDs from 101).
var textFillCases = []struct {
	name   string
	format rewrite.CopyFormat
	in     string
	want   string
}{
	{"text rows", textFormat, "a\t1\nb\t2\n", "a\t1\t101\nb\t2\t102\n"},
	{"text empty line is a row", textFormat, "a\n\nb\n", "a\t101\n\t102\nb\t103\n"},
	{"text last row without a line end", textFormat, "a\nb", "a\t101\nb\t102"},
	{"text CRLF", textFormat, "a\r\nb\r\n", "a\t101\r\nb\t102\r\n"},
	{"text CR alone", textFormat, "a\rb\r", "a\t101\rb\t102\r"},
	{"text last row ends in CR", textFormat, "a\r", "a\t101\r"},
	{"text escapes", textFormat, "a\\tb\\\\\tc\\nd\n", "a\\tb\\\\\tc\\nd\t101\n"},
	{"text backslash takes a newline as data", textFormat, "a\\\nb\nc\n", "a\\\nb\t101\nc\t102\n"},
	{"text backslash takes a CR as data", textFormat, "a\\\rb\r\nc\r\n", "a\\\rb\t101\r\nc\t102\r\n"},
	{"text NULL marker and quotes are data", textFormat, "\\N\t\"x\n", "\\N\t\"x\t101\n"},
	{"text end marker", textFormat, "a\n\\.\nignored\n", "a\t101\n\\.\nignored\n"},
	{"text end marker after data on its line", textFormat, "a\nb\\.\n", "a\t101\nb\t102\\.\n"},
	{"text escaped backslash before a period is data", textFormat, "a\\\\.\n", "a\\\\.\t101\n"},
	{"text multibyte UTF-8", textFormat, "żółw\t🐢\n", "żółw\t🐢\t101\n"},
	{"text header", with(textFormat, func(f *rewrite.CopyFormat) { f.Header = "true" }), "item\na\n", "item\na\t101\n"},
	{"text custom delimiter", with(textFormat, func(f *rewrite.CopyFormat) { f.Delimiter = '|' }), "a|b\n", "a|b|101\n"},
	{"csv rows", csvFormat, "a,1\nb,2\n", "a,1,101\nb,2,102\n"},
	{"csv quoted newline and CRLF", csvFormat, "\"a\nb\",1\r\n\"c\r\nd\",2\r\n", "\"a\nb\",1,101\r\n\"c\r\nd\",2,102\r\n"},
	{"csv doubled quotes", csvFormat, "\"say \"\"hi\"\"\n\",x\ny\n", "\"say \"\"hi\"\"\n\",x,101\ny,102\n"},
	{"csv empty quoted field then newline", csvFormat, "\"\"\n\"\"\"\"\n", "\"\",101\n\"\"\"\",102\n"},
	{"csv backslashes are data", csvFormat, "a\\,b\\\n", "a\\,b\\,101\n"},
	{"csv end marker alone on a line", csvFormat, "a\n\\.\nb\n", "a,101\n\\.\nb\n"},
	{"csv backslash-period with more on the line is data", csvFormat, "\\.x\n", "\\.x,101\n"},
	{"csv backslash-period inside quotes is data", csvFormat, "\"a\n\\.\n\"\n", "\"a\n\\.\n\",101\n"},
	{"csv header with a quoted newline", with(csvFormat, func(f *rewrite.CopyFormat) { f.Header = "true" }),
		"\"it\nem\",qty\na,1\n", "\"it\nem\",qty\na,1,101\n"},
	{"csv header match", with(csvFormat, func(f *rewrite.CopyFormat) { f.Header = "match" }), "item\na\n", "item,\"id\"\na,101\n"},
	{"csv custom quote, escape and delimiter", with(csvFormat, func(f *rewrite.CopyFormat) { f.Delimiter, f.Quote, f.Escape = ';', '\'', '\\' }),
		"'a\\'\n;b';c\n'\\\\';d\n", "'a\\'\n;b';c;101\n'\\\\';d;102\n"},
	{"csv escape outside quotes is data", with(csvFormat, func(f *rewrite.CopyFormat) { f.Escape = '\\' }), "a\\\"b\nc\"\n", "a\\\"b\nc\",101\n"},
	{"csv last row without a line end", csvFormat, "a\n\"b\nc\"", "a,101\n\"b\nc\",102"},
	{"csv multibyte UTF-8", csvFormat, "\"żółw, 🐢\",\"\"\"ü\"\"\"\n", "\"żółw, 🐢\",\"\"\"ü\"\"\",101\n"},
}

func TestTextFiller(t *testing.T) {
	for _, tc := range textFillCases {
		t.Run(tc.name, func(t *testing.T) {
			cols := []string{"id"}
			if got := textFill(t, tc.format, cols, []byte(tc.in)); got != tc.want {
				t.Fatalf("in one piece:\n got %q\nwant %q", got, tc.want)
			}
			// Cut anywhere, and in single bytes: the same stream.
			for i := 0; i <= len(tc.in); i++ {
				if got := textFill(t, tc.format, cols, []byte(tc.in[:i]), []byte(tc.in[i:])); got != tc.want {
					t.Fatalf("cut at %d:\n got %q\nwant %q", i, got, tc.want)
				}
			}
			var bytesIn [][]byte
			for i := range len(tc.in) {
				bytesIn = append(bytesIn, []byte{tc.in[i]})
			}
			if got := textFill(t, tc.format, cols, bytesIn...); got != tc.want {
				t.Fatalf("byte by byte:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestTextFillerTwoKeys appends one field per key, in order.
func TestTextFillerTwoKeys(t *testing.T) {
	if got := textFill(t, csvFormat, []string{"id", "seq"}, []byte("a\nb\n")); got != "a,101,102\nb,103,104\n" {
		t.Fatalf("got %q", got)
	}
	match := with(textFormat, func(f *rewrite.CopyFormat) { f.Header = "match" })
	if got := textFill(t, match, []string{"id", "a\tb\\"}, []byte("item\nx\n")); got != "item\tid\ta\\\tb\\\\\nx\t101\t102\n" {
		t.Fatalf("header match in text: got %q", got)
	}
}

// FuzzTextFiller cuts an arbitrary stream at every position, and at two arbitrary ones:
// in both formats the output must be the same as for the uncut stream, and removing the
// appended keys must give back the input.
func FuzzTextFiller(f *testing.F) {
	for _, tc := range textFillCases {
		f.Add([]byte(tc.in), uint16(1), uint16(3), tc.format.Kind == "csv")
	}
	f.Fuzz(func(t *testing.T, in []byte, a, b uint16, csv bool) {
		format := textFormat
		if csv {
			format = csvFormat
		}
		i, j := int(a)%(len(in)+1), int(b)%(len(in)+1)
		if i > j {
			i, j = j, i
		}
		whole := textFill(t, format, []string{"id"}, in)
		for k := range len(in) {
			if cut := textFill(t, format, []string{"id"}, in[:k], in[k:]); cut != whole {
				t.Fatalf("cut at %d:\n got %q\nwant %q", k, cut, whole)
			}
		}
		cut := textFill(t, format, []string{"id"}, in[:i], in[i:j], in[j:])
		if whole != cut {
			t.Fatalf("cut at %d and %d:\n got %q\nwant %q", i, j, cut, whole)
		}
		// The keys are the only bytes added: each is the delimiter and 3 digits.
		stripped := []byte(whole)
		for id := 101; ; id++ {
			key := []byte{format.Delimiter}
			key = append(key, []byte(itoa(id))...)
			k := bytes.Index(stripped, key)
			if k < 0 {
				break
			}
			stripped = append(stripped[:k:k], stripped[k+len(key):]...)
		}
		if !bytes.Equal(stripped, in) && !strings.Contains(string(in), "10") {
			t.Fatalf("keys removed, %q is not the input %q", stripped, in)
		}
	})
}
