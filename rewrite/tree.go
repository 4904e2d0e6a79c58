package rewrite

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"github.com/pganalyze/pg_query_go/v6/parser"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// parseTree parses sql with PostgreSQL's grammar and returns the tree
// pg_query.Parse would return, with the locations of its A_Const nodes
// (which the shape cache needs) collected on the way.
//
// pg_query.Parse has libpg_query render the tree as protobuf and unmarshals
// that; the C rendering alone costs several times the parse itself.
// libpg_query's JSON rendering of the same tree is much cheaper, and it
// follows protobuf's JSON mapping, so decodeTree builds pg_query's structs
// from it directly. The decoder accepts only what that renderer writes;
// anything else sends the text down pg_query.Parse, so the tree never
// depends on the route.
func parseTree(sql string) (*pg_query.ParseResult, []int32, error) {
	js, err := parser.ParseToJSON(sql)
	if err != nil {
		return nil, nil, err
	}
	tree, consts, err := decodeTree(js)
	switch {
	case err == nil:
		return tree, consts, nil
	case errors.Is(err, errTreeTooDeep):
		// pg_query.Parse would fail on it too, or run out of C stack rendering it.
		return nil, nil, errTooDeep
	}
	tree, err = pg_query.Parse(sql)
	if err != nil {
		return nil, nil, err
	}
	return tree, constLocations(tree), nil
}

// decodeTree reads libpg_query's JSON rendering of a parse tree.
func decodeTree(js string) (*pg_query.ParseResult, []int32, error) {
	d := treeDecoder{s: js}
	tree := &pg_query.ParseResult{}
	if err := d.message(reflect.ValueOf(tree).Elem(), nodeTypes[reflect.TypeFor[pg_query.ParseResult]()]); err != nil {
		return nil, nil, err
	}
	if d.i != len(js) {
		return nil, nil, errTreeJSON
	}
	return tree, d.consts, nil
}

var (
	errTreeJSON    = errors.New("rewrite: unexpected parse tree JSON")
	errTreeTooDeep = errors.New("rewrite: parse tree nested too deeply")
)

// treeDecoder reads libpg_query's JSON rendering of a parse tree into
// pg_query's structs: objects keyed by the fields' JSON names, a Node as an
// object holding its one set field, enums by name, integers as numbers,
// and no insignificant space.
type treeDecoder struct {
	s      string // the JSON
	i      int    // the cursor in s
	depth  int    // of the message being decoded
	consts []int32
	stack  []reflect.Value // elements of the lists being decoded
}

// maxTreeDepth bounds the nesting of messages the decoder reads, as
// protobuf's recursion limit bounds pg_query.Parse. A tree that deep is
// refused (errTooDeep) rather than handed to pg_query.Parse, whose C side
// could run out of stack rendering it; chainDepth normally turns such
// statements away before they are parsed at all.
const maxTreeDepth = protowire.DefaultRecursionLimit

// message decodes one object into the generated message struct v of
// type nt.
func (d *treeDecoder) message(v reflect.Value, nt *nodeType) error {
	if d.depth >= maxTreeDepth {
		return errTreeTooDeep
	}
	if nt == nil || !d.consume('{') {
		return errTreeJSON
	}
	d.depth++
	defer func() { d.depth-- }()
	next := 0 // in nt.order: fields come in order, so the key is usually the next one or a little after it
	for first := true; !d.consume('}'); first = false {
		if !first && !d.consume(',') {
			return errTreeJSON
		}
		key, ok := d.key()
		if !ok {
			return errTreeJSON
		}
		var f *jsonField
		for i := next; i < len(nt.order) && i < next+4; i++ {
			if nt.order[i].json == key {
				f = nt.order[i]
				break
			}
		}
		if f == nil {
			// A Node's one field among hundreds, or a jump.
			if f = nt.fields[key]; f == nil {
				return errTreeJSON
			}
		}
		next = f.order + 1
		if err := d.field(v.Field(f.index), f); err != nil {
			return err
		}
	}
	if nt.aConst {
		d.consts = append(d.consts, int32(v.Field(nt.location).Int()))
	}
	return nil
}

// field decodes the value of field f into fv.
func (d *treeDecoder) field(fv reflect.Value, f *jsonField) error {
	if !f.list {
		return d.value(fv, f)
	}
	if f.kind != protoreflect.MessageKind || !d.consume('[') {
		return errTreeJSON // no list of scalars occurs in a parse tree
	}
	// Collect the elements on a stack shared by all levels, so that each
	// list is allocated once, at its final length.
	base := len(d.stack)
	for first := true; !d.consume(']'); first = false {
		if !first && !d.consume(',') {
			return errTreeJSON
		}
		m := reflect.New(f.message)
		if err := d.message(m.Elem(), f.node); err != nil {
			return err
		}
		d.stack = append(d.stack, m)
	}
	n := len(d.stack) - base
	if n > 0 {
		l := reflect.MakeSlice(fv.Type(), n, n)
		for i, m := range d.stack[base:] {
			l.Index(i).Set(m)
		}
		fv.Set(l)
	}
	d.stack = d.stack[:base]
	return nil
}

// value decodes one value of field f into fv.
func (d *treeDecoder) value(fv reflect.Value, f *jsonField) error {
	switch f.kind {
	case protoreflect.MessageKind:
		if strings.HasPrefix(d.s[d.i:], "null") {
			d.i += len("null") // an absent message
			return nil
		}
		m := reflect.New(f.message)
		if err := d.message(m.Elem(), f.node); err != nil {
			return err
		}
		if f.wrapper != nil {
			// A oneof member: the field is an interface holding a
			// wrapper struct whose one field is the message.
			w := reflect.New(f.wrapper)
			w.Elem().Field(0).Set(m)
			m = w
		}
		fv.Set(m)
	case protoreflect.StringKind:
		s, ok := d.str()
		if !ok {
			return errTreeJSON
		}
		fv.SetString(s)
	case protoreflect.BoolKind:
		switch {
		case strings.HasPrefix(d.s[d.i:], "true"):
			d.i += len("true")
			fv.SetBool(true)
		case strings.HasPrefix(d.s[d.i:], "false"):
			d.i += len("false")
			fv.SetBool(false)
		default:
			return errTreeJSON
		}
	case protoreflect.EnumKind:
		name, ok := d.plainString()
		if !ok {
			return errTreeJSON
		}
		n, ok := f.enum[name]
		if !ok {
			return errTreeJSON
		}
		fv.SetInt(int64(n))
	case protoreflect.Int32Kind, protoreflect.Int64Kind:
		n, err := strconv.ParseInt(d.number(), 10, fv.Type().Bits())
		if err != nil {
			return errTreeJSON
		}
		fv.SetInt(n)
	case protoreflect.Uint32Kind, protoreflect.Uint64Kind:
		n, err := strconv.ParseUint(d.number(), 10, fv.Type().Bits())
		if err != nil {
			return errTreeJSON
		}
		fv.SetUint(n)
	default:
		return errTreeJSON // no other kind occurs in a parse tree
	}
	return nil
}

func (d *treeDecoder) consume(c byte) bool {
	if d.i < len(d.s) && d.s[d.i] == c {
		d.i++
		return true
	}
	return false
}

// key reads an object key and its colon. Keys are field names: no escapes.
func (d *treeDecoder) key() (string, bool) {
	key, ok := d.plainString()
	return key, ok && d.consume(':')
}

// number returns the integer at the cursor, for strconv to check.
func (d *treeDecoder) number() string {
	start := d.i
	if d.i < len(d.s) && d.s[d.i] == '-' {
		d.i++
	}
	for d.i < len(d.s) && d.s[d.i] >= '0' && d.s[d.i] <= '9' {
		d.i++
	}
	return d.s[start:d.i]
}

// str reads a string value. It must be UTF-8, as the protobuf route
// requires; the result is a copy, so that a plan keeping a name from the
// tree does not pin the whole JSON text.
func (d *treeDecoder) str() (string, bool) {
	if !d.consume('"') {
		return "", false
	}
	// Most strings have no escapes: then the JSON bytes are the string.
	end := d.i
	for end < len(d.s) && d.s[end] != '"' && d.s[end] != '\\' && d.s[end] >= ' ' {
		end++
	}
	if end < len(d.s) && d.s[end] == '"' {
		s := strings.Clone(d.s[d.i:end])
		d.i = end + 1
		return s, utf8.ValidString(s)
	}
	var b []byte
	start := d.i
	for d.i < len(d.s) {
		switch c := d.s[d.i]; {
		case c == '"':
			b = append(b, d.s[start:d.i]...)
			d.i++
			return string(b), utf8.Valid(b)
		case c == '\\':
			b = append(b, d.s[start:d.i]...)
			r, ok := d.escape()
			if !ok {
				return "", false
			}
			b = append(b, r)
			start = d.i
		case c < ' ':
			return "", false
		default:
			d.i++
		}
	}
	return "", false
}

// plainString reads a string without escapes: an object key or an enum value's name.
func (d *treeDecoder) plainString() (string, bool) {
	if !d.consume('"') {
		return "", false
	}
	end := strings.IndexByte(d.s[d.i:], '"')
	if end < 0 {
		return "", false
	}
	str := d.s[d.i : d.i+end]
	d.i += end + 1
	return str, strings.IndexByte(str, '\\') < 0
}

// escape decodes the escape at the cursor. The renderer escapes only
// ASCII: quotes, backslashes, control characters, < and >.
func (d *treeDecoder) escape() (byte, bool) {
	if d.i+1 >= len(d.s) {
		return 0, false
	}
	c := d.s[d.i+1]
	d.i += 2
	switch c {
	case '"', '\\', '/':
		return c, true
	case 'b':
		return '\b', true
	case 'f':
		return '\f', true
	case 'n':
		return '\n', true
	case 'r':
		return '\r', true
	case 't':
		return '\t', true
	case 'u':
		if d.i+4 > len(d.s) {
			return 0, false
		}
		n, err := strconv.ParseUint(d.s[d.i:d.i+4], 16, 16)
		d.i += 4
		if err != nil || n >= utf8.RuneSelf {
			return 0, false
		}
		return byte(n), true
	}
	return 0, false
}
