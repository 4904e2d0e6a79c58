package rewrite

import (
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// refWalk is walk written with protoreflect alone: every populated
// message-valued field in descriptor order, Node wrappers unwrapped.
func refWalk(m protoreflect.Message, visit func(proto.Message)) {
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() || !m.Has(fd) {
			continue
		}
		if fd.IsList() {
			l := m.Get(fd).List()
			for j := 0; j < l.Len(); j++ {
				refChild(l.Get(j).Message(), visit)
			}
			continue
		}
		refChild(m.Get(fd).Message(), visit)
	}
}

func refChild(m protoreflect.Message, visit func(proto.Message)) {
	if _, ok := m.Interface().(*pg_query.Node); ok {
		fd := m.WhichOneof(m.Descriptor().Oneofs().ByName("node"))
		if fd == nil {
			return
		}
		m = m.Get(fd).Message()
	}
	visit(m.Interface())
	refWalk(m, visit)
}

// TestWalkMatchesProtoreflect checks that walk visits the same messages in
// the same order as a walk through protoreflect, on the trees of the
// corpus and on one message of every type with all its fields set.
func TestWalkMatchesProtoreflect(t *testing.T) {
	var trees []proto.Message
	for _, sql := range treeCorpus(t) {
		if tree, err := pg_query.Parse(sql); err == nil {
			trees = append(trees, tree)
		}
	}
	msgs := (&pg_query.Node{}).ProtoReflect().Descriptor().ParentFile().Messages()
	for i := 0; i < msgs.Len(); i++ {
		trees = append(trees, filled(t, msgs.Get(i), 2).Interface())
	}
	for _, tree := range trees {
		var got, want []proto.Message
		walk(tree, func(m proto.Message) bool { got = append(got, m); return true })
		refWalk(tree.ProtoReflect(), func(m proto.Message) { want = append(want, m) })
		if len(got) != len(want) {
			t.Fatalf("walk visited %d messages of %v, protoreflect %d", len(got), tree, len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("walk visit %d of %v: %T, protoreflect %T", i, tree, got[i], want[i])
			}
		}
	}
}

// filled returns a message of type md whose message-valued fields are set
// depth levels down: lists get two elements, a oneof its first member, and
// every Node holds a String.
func filled(t *testing.T, md protoreflect.MessageDescriptor, depth int) protoreflect.Message {
	t.Helper()
	if md.FullName() == "pg_query.Node" {
		return pg_query.MakeStrNode("x").ProtoReflect()
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		t.Fatal(err)
	}
	m := mt.New()
	if depth == 0 {
		return m
	}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
			continue
		}
		if od := fd.ContainingOneof(); od != nil && od.Fields().Get(0) != fd {
			continue
		}
		if fd.IsList() {
			l := m.Mutable(fd).List()
			l.Append(protoreflect.ValueOfMessage(filled(t, fd.Message(), depth-1)))
			l.Append(protoreflect.ValueOfMessage(filled(t, fd.Message(), depth-1)))
			continue
		}
		m.Set(fd, protoreflect.ValueOfMessage(filled(t, fd.Message(), depth-1)))
	}
	return m
}

// TestMinLocationStopsAtFirstRow checks the premise of minLocation's early
// stop on the VALUES lists of the corpus: no later row has a location
// before the first row's.
func TestMinLocationStopsAtFirstRow(t *testing.T) {
	checked := 0
	for _, sql := range treeCorpus(t) {
		tree, err := pg_query.Parse(sql)
		if err != nil {
			continue
		}
		walk(tree, func(m proto.Message) bool {
			sel, ok := m.(*pg_query.SelectStmt)
			if !ok || len(sel.ValuesLists) < 2 {
				return true
			}
			all := -1
			for _, row := range sel.ValuesLists {
				if loc := minLocation([]*pg_query.Node{row}); loc >= 0 && (all < 0 || loc < all) {
					all = loc
				}
			}
			if got := minLocation(sel.ValuesLists); got != all {
				t.Errorf("%q: minLocation = %d, smallest of all rows %d", sql, got, all)
			}
			checked++
			return true
		})
	}
	if checked < 10 {
		t.Fatalf("only %d multi-row VALUES lists in the corpus", checked)
	}
}
