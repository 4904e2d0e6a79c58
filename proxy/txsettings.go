package proxy

import (
	"encoding/binary"
	"slices"
	"strings"
	"unique"

	"github.com/leafproxy/leafproxy/proxy/pool"
)

// The client's settings in transaction mode, and giving a connection back once the
// settings a transaction changed are read back.

// applySettings returns the Query that gives pc the client's settings, or nothing when
// they are already there.
func (v *pooledConn) applySettings(out []byte) []byte {
	pc := v.pc
	key := v.settingsKey()
	if pc.applied && pc.appliedKey == key {
		return out // brought to these very settings before, by this client or another
	}
	pc.applied, pc.appliedKey = true, key
	var sets, resets []string
	for name, want := range v.params {
		if have, ok := pc.params[name]; !ok || have != want {
			sets = append(sets, "pg_catalog.set_config("+quoteLiteral(name)+", "+quoteLiteral(want)+", false)")
			pc.setParam(name, want)
		}
	}
	// pc.params holds every reported name; only when it holds more can a setting of an
	// earlier borrower need a RESET.
	if len(pc.params) > len(pc.reported) {
		for name := range pc.params {
			if _, ok := v.params[name]; !ok && !pc.reported[name] {
				resets = append(resets, "RESET "+quoteIdent(name))
				pc.dropParam(name)
			}
		}
	}
	if len(sets) == 0 && len(resets) == 0 {
		return out
	}
	var sql strings.Builder
	if len(sets) > 0 {
		sql.WriteString("SELECT " + strings.Join(sets, ", ") + ";")
	}
	for _, r := range resets {
		sql.WriteString(r + ";")
	}
	v.push(expect{kind: expInjectedQuery})
	v.outstanding++
	pc.unnamed = nil
	return appendQuery(out, sql.String())
}

// settingsKey returns the client's settings as an interned text, equal for clients with
// equal settings, so that applySettings can tell at once a connection that already has
// them.
func (v *pooledConn) settingsKey() unique.Handle[string] {
	if !v.keyOK {
		names := make([]string, 0, len(v.params))
		for name := range v.params {
			names = append(names, name)
		}
		slices.Sort(names)
		var b strings.Builder
		for _, name := range names {
			b.WriteString(name)
			b.WriteByte(0)
			b.WriteString(v.params[name])
			b.WriteByte(0)
		}
		v.paramsKey, v.keyOK = unique.Make(b.String()), true
	}
	return v.paramsKey
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// afterReady gives the connection back when a ReadyForQuery leaves it idle, after reading
// back the client's settings when it ran a SET.
func (v *pooledConn) afterReady(body []byte) {
	if len(body) == 1 {
		v.txStatus = body[0]
	}
	if !v.idle() {
		return
	}
	if v.needCapture {
		v.needCapture = false
		v.pc.unnamed = nil
		v.push(expect{kind: expInjectedQuery, capture: true})
		v.outstanding++
		if _, err := v.pc.nc.Write(appendQuery(nil, v.captureQuery())); err != nil {
			v.giveBack(pool.Broken)
		}
		return
	}
	v.readerOn = false
	v.pc.prepared.endBorrow()
	v.deallocPortals = nil
	if v.writers == 0 {
		v.giveBack(pool.Clean)
	} else {
		v.release = true
	}
}

// captured notes one row of captureSQL: a setting the client's session has.
func (v *pooledConn) captured(row []byte) {
	cols := dataRowText(row)
	if len(cols) != 2 {
		return
	}
	name := strings.ToLower(cols[0])
	if notCarried[name] {
		return
	}
	v.captureNames = append(v.captureNames, name)
	v.params[name] = cols[1]
	v.pc.setParam(name, cols[1])
	v.keyOK, v.pc.applied = false, false
}

// endCapture forgets the settings the client no longer has (RESET, DISCARD ALL).
func (v *pooledConn) endCapture() {
	keep := make(map[string]bool, len(v.captureNames))
	for _, n := range v.captureNames {
		keep[n] = true
	}
	for name := range v.params {
		if !keep[name] && !v.pc.reported[name] {
			delete(v.params, name)
			v.pc.dropParam(name)
			v.keyOK, v.pc.applied = false, false
		}
	}
	v.captureNames = v.captureNames[:0]
}

// dataRowText returns the columns of a DataRow in text format; NULL is "".
func dataRowText(body []byte) []string {
	if len(body) < 2 {
		return nil
	}
	n := int(binary.BigEndian.Uint16(body))
	body = body[2:]
	cols := make([]string, 0, n)
	for range n {
		if len(body) < 4 {
			return nil
		}
		l := int(int32(binary.BigEndian.Uint32(body)))
		body = body[4:]
		if l < 0 {
			cols = append(cols, "")
			continue
		}
		if len(body) < l {
			return nil
		}
		cols = append(cols, string(body[:l]))
		body = body[l:]
	}
	return cols
}
