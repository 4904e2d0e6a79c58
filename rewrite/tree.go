package rewrite

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"github.com/pganalyze/pg_query_go/v6/parser"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// parseTree parses sql with PostgreSQL's grammar and returns the tree
// pg_query.Parse would return, with the locations of its A_Const nodes
// (which the shape cache needs) collected on the way.
//
// pg_query.Parse has libpg_query render the tree as protobuf and unmarshals
// that; the C rendering alone costs several times the parse itself.
// libpg_query's JSON rendering of the same tree is much cheaper, and it
// follows protobuf's JSON mapping, so transcodeTree turns it into the
// protobuf encoding, and the same proto.Unmarshal builds the tree. The
// transcoder accepts only what that renderer writes; anything else sends
// the text down pg_query.Parse, so the tree never depends on the route.
func parseTree(sql string) (*pg_query.ParseResult, []int32, error) {
	js, err := parser.ParseToJSON(sql)
	if err != nil {
		return nil, nil, err
	}
	if tree, consts, err := decodeTree(js); err == nil {
		return tree, consts, nil
	}
	tree, err := pg_query.Parse(sql)
	if err != nil {
		return nil, nil, err
	}
	return tree, constLocations(tree), nil
}

// decodeTree reads libpg_query's JSON rendering of a parse tree.
func decodeTree(js string) (*pg_query.ParseResult, []int32, error) {
	d := treeDecoder{s: js, buf: make([]byte, 0, len(js))}
	tree := &pg_query.ParseResult{}
	if err := d.message(tree.ProtoReflect().Descriptor()); err != nil {
		return nil, nil, err
	}
	if d.i != len(js) {
		return nil, nil, errTreeJSON
	}
	// Unmarshal checks what the transcoder does not: that strings are
	// UTF-8, as the protobuf route requires.
	if err := proto.Unmarshal(d.buf, tree); err != nil {
		return nil, nil, err
	}
	return tree, d.consts, nil
}

var errTreeJSON = errors.New("rewrite: unexpected parse tree JSON")

// treeDecoder transcodes libpg_query's JSON rendering of a parse tree to
// protobuf: objects keyed by the fields' JSON names, a Node as an object
// holding its one set field, enums by name, integers as numbers, and no
// insignificant space.
type treeDecoder struct {
	s      string // the JSON
	i      int    // the cursor in s
	buf    []byte // the protobuf encoding
	consts []int32
}

var (
	aConst         = (&pg_query.A_Const{}).ProtoReflect().Descriptor()
	aConstLocation = aConst.Fields().ByName("location").Number()
)

// message transcodes the fields of one object of type md, without the
// object's own tag and length.
func (d *treeDecoder) message(md protoreflect.MessageDescriptor) error {
	if !d.consume('{') {
		return errTreeJSON
	}
	fields := md.Fields()
	isAConst := md == aConst
	for first := true; !d.consume('}'); first = false {
		if !first && !d.consume(',') {
			return errTreeJSON
		}
		key, ok := d.key()
		if !ok {
			return errTreeJSON
		}
		fd := fields.ByJSONName(key)
		if fd == nil || fd.IsMap() {
			return errTreeJSON
		}
		if isAConst && fd.Number() == aConstLocation {
			start := d.i
			n, err := strconv.ParseInt(d.number(), 10, 32)
			if err != nil {
				return errTreeJSON
			}
			d.consts = append(d.consts, int32(n))
			d.i = start
		}
		if err := d.field(fd); err != nil {
			return err
		}
	}
	return nil
}

// field transcodes the value of field fd. A list becomes one field per
// element, which Unmarshal reads for packed and unpacked fields alike.
func (d *treeDecoder) field(fd protoreflect.FieldDescriptor) error {
	if !fd.IsList() {
		return d.value(fd)
	}
	if !d.consume('[') {
		return errTreeJSON
	}
	for first := true; !d.consume(']'); first = false {
		if !first && !d.consume(',') {
			return errTreeJSON
		}
		if err := d.value(fd); err != nil {
			return err
		}
	}
	return nil
}

// value transcodes one value of field fd.
func (d *treeDecoder) value(fd protoreflect.FieldDescriptor) error {
	num := fd.Number()
	switch fd.Kind() {
	case protoreflect.MessageKind:
		if strings.HasPrefix(d.s[d.i:], "null") {
			d.i += len("null") // an absent message
			return nil
		}
		d.buf = protowire.AppendTag(d.buf, num, protowire.BytesType)
		// Reserve one byte for the length, the most a small message
		// needs, and make room for more once the length is known.
		at := len(d.buf)
		d.buf = append(d.buf, 0)
		if err := d.message(fd.Message()); err != nil {
			return err
		}
		n := len(d.buf) - at - 1
		if size := protowire.SizeVarint(uint64(n)); size > 1 {
			d.buf = append(d.buf, make([]byte, size-1)...)
			copy(d.buf[at+size:], d.buf[at+1:at+1+n])
		}
		protowire.AppendVarint(d.buf[:at], uint64(n))
		return nil
	case protoreflect.StringKind:
		d.buf = protowire.AppendTag(d.buf, num, protowire.BytesType)
		return d.str()
	case protoreflect.BoolKind:
		var v uint64
		switch {
		case strings.HasPrefix(d.s[d.i:], "true"):
			d.i += len("true")
			v = 1
		case strings.HasPrefix(d.s[d.i:], "false"):
			d.i += len("false")
		default:
			return errTreeJSON
		}
		d.buf = protowire.AppendTag(d.buf, num, protowire.VarintType)
		d.buf = protowire.AppendVarint(d.buf, v)
		return nil
	case protoreflect.EnumKind:
		name, ok := d.enumName()
		if !ok {
			return errTreeJSON
		}
		ev := fd.Enum().Values().ByName(protoreflect.Name(name))
		if ev == nil {
			return errTreeJSON
		}
		d.buf = protowire.AppendTag(d.buf, num, protowire.VarintType)
		d.buf = protowire.AppendVarint(d.buf, uint64(int64(ev.Number())))
		return nil
	}
	var v uint64
	switch fd.Kind() {
	case protoreflect.Int32Kind:
		n, err := strconv.ParseInt(d.number(), 10, 32)
		if err != nil {
			return errTreeJSON
		}
		v = uint64(n) // negative numbers take ten bytes, as protobuf encodes them
	case protoreflect.Int64Kind:
		n, err := strconv.ParseInt(d.number(), 10, 64)
		if err != nil {
			return errTreeJSON
		}
		v = uint64(n)
	case protoreflect.Uint32Kind:
		n, err := strconv.ParseUint(d.number(), 10, 32)
		if err != nil {
			return errTreeJSON
		}
		v = n
	case protoreflect.Uint64Kind:
		n, err := strconv.ParseUint(d.number(), 10, 64)
		if err != nil {
			return errTreeJSON
		}
		v = n
	default:
		return errTreeJSON // no other kind occurs in a parse tree
	}
	d.buf = protowire.AppendTag(d.buf, num, protowire.VarintType)
	d.buf = protowire.AppendVarint(d.buf, v)
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
	if !d.consume('"') {
		return "", false
	}
	end := strings.IndexByte(d.s[d.i:], '"')
	if end < 0 {
		return "", false
	}
	key := d.s[d.i : d.i+end]
	d.i += end + 1
	return key, strings.IndexByte(key, '\\') < 0 && d.consume(':')
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

// str transcodes a string value to its length and bytes.
func (d *treeDecoder) str() error {
	if !d.consume('"') {
		return errTreeJSON
	}
	// Most strings have no escapes: then the JSON bytes are the string.
	end := d.i
	for end < len(d.s) && d.s[end] != '"' && d.s[end] != '\\' && d.s[end] >= ' ' {
		end++
	}
	if end < len(d.s) && d.s[end] == '"' {
		d.buf = protowire.AppendString(d.buf, d.s[d.i:end])
		d.i = end + 1
		return nil
	}
	var b []byte
	start := d.i
	for d.i < len(d.s) {
		switch c := d.s[d.i]; {
		case c == '"':
			b = append(b, d.s[start:d.i]...)
			d.i++
			d.buf = protowire.AppendBytes(d.buf, b)
			return nil
		case c == '\\':
			b = append(b, d.s[start:d.i]...)
			r, ok := d.escape()
			if !ok {
				return errTreeJSON
			}
			b = append(b, r)
			start = d.i
		case c < ' ':
			return errTreeJSON
		default:
			d.i++
		}
	}
	return errTreeJSON
}

// enumName reads an enum value's name: a string without escapes.
func (d *treeDecoder) enumName() (string, bool) {
	if !d.consume('"') {
		return "", false
	}
	end := strings.IndexByte(d.s[d.i:], '"')
	if end < 0 {
		return "", false
	}
	name := d.s[d.i : d.i+end]
	d.i += end + 1
	return name, strings.IndexByte(name, '\\') < 0
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
