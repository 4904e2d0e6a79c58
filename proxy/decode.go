package proxy

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/rewrite"
)

// bindDecode checks the ID a Bind passes to SELECT leaf_decode($n) and forwards the Bind:
// a NULL or negative ID is 22023, as a literal one is when planned. A value that is no
// integer at all is the server's to report, as for any int8 parameter.
func (c *conn) bindDecode(d *rewrite.Decode, body []byte) error {
	m, _, ok := parseBind(body)
	if !ok || d.Param > len(m.params) || (len(m.formats) > 1 && len(m.formats) != len(m.params)) {
		return c.forwardExtended(clientBind, body) // the server reports the malformed Bind
	}
	v := m.params[d.Param-1]
	if v == nil {
		return c.refuseExtended(&rewrite.Error{Code: sqlstate.InvalidParameterValue,
			Message: fmt.Sprintf("the ID passed to leaf_decode() in parameter $%d is NULL", d.Param)}, false)
	}
	if id, err := bindInt(v, m.format(d.Param-1), 0); err == nil && id < 0 {
		return c.refuseExtended(&rewrite.Error{Code: sqlstate.InvalidParameterValue,
			Message: fmt.Sprintf("%d is not a snowflake ID: IDs are not negative", id)}, false)
	}
	return c.forwardExtended(clientBind, body)
}

// SELECT leaf_decode(id) is answered by the proxy itself where it answers the single
// leaf_next (a Query with nothing in flight, an extended-protocol cycle outside a
// transaction block) when it can print the timestamp exactly as the server would: in the
// session's TimeZone, with DateStyle ISO (both tracked from ParameterStatus). Elsewhere,
// and for a parameter the proxy cannot read as the server would, the rewritten SQL runs
// at the server and gives the same messages.

// OIDs of leaf_decode's result columns.
const oidTimestamptz = 1184

// decodeColumns are leaf_decode's result columns: timestamptz, then two int8.
var decodeColumns = [3]struct {
	name string
	oid  uint32
}{{"timestamp", oidTimestamptz}, {"worker", oidInt8}, {"sequence", oidInt8}}

// timeFormat is how the session prints a timestamptz, when the proxy can do it.
type timeFormat struct {
	iso bool           // DateStyle starts with ISO
	loc *time.Location // TimeZone, when Go's zone database knows it
}

// decodeRow appends the DataRow of leaf_decode(id), reporting false when the text format
// is asked for and the session's format is not known.
func (c *conn) decodeRow(b []byte, d *rewrite.Decode, id int64, binaryFormat bool) ([]byte, bool) {
	millis, worker, seq := d.Split(id)
	var ts []byte
	if binaryFormat {
		// Microseconds since 2000-01-01 00:00:00 UTC.
		ts = binary.BigEndian.AppendUint64(nil, uint64((millis-946684800000)*1000))
	} else {
		tf := c.server.timeFormat.Load()
		if tf == nil || !tf.iso || tf.loc == nil {
			return b, false
		}
		ts = appendISOTimestamptz(nil, time.UnixMilli(millis).In(tf.loc))
	}
	b, at := beginMessage(b, serverDataRow)
	b = binary.BigEndian.AppendUint16(b, 3)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ts)))
	b = append(b, ts...)
	b = appendInt8Value(b, worker, binaryFormat)
	b = appendInt8Value(b, seq, binaryFormat)
	b = endMessage(b, at)
	return b, true
}

// appendISOTimestamptz prints t as PostgreSQL's timestamptz output in DateStyle ISO:
// 2023-11-14 22:13:20.123+00, fractional seconds without trailing zeros, the offset as
// +HH, +HH:MM or +HH:MM:SS.
func appendISOTimestamptz(b []byte, t time.Time) []byte {
	b = t.AppendFormat(b, "2006-01-02 15:04:05.999999")
	_, off := t.Zone()
	sign := byte('+')
	if off < 0 {
		sign, off = '-', -off
	}
	b = append(b, sign)
	b = append(b, byte('0'+off/36000), byte('0'+off/3600%10))
	if m, s := off/60%60, off%60; m != 0 || s != 0 {
		b = append(b, ':', byte('0'+m/10), byte('0'+m%10))
		if s != 0 {
			b = append(b, ':', byte('0'+s/10), byte('0'+s%10))
		}
	}
	return b
}

// appendDecodeDescription appends leaf_decode's RowDescription.
func appendDecodeDescription(b []byte, binaryFormat bool) []byte {
	b, at := beginMessage(b, serverRowDescription)
	b = binary.BigEndian.AppendUint16(b, uint16(len(decodeColumns)))
	for _, col := range decodeColumns {
		b = appendField(b, col.name, col.oid, binaryFormat)
	}
	return endMessage(b, at)
}

// decodeQuery answers a Query that is SELECT leaf_decode(<literal>) itself when nothing is
// outstanding, the transaction has not failed and the session's time format is known; it
// reports false when the rewritten query must go to the server instead.
func (c *conn) decodeQuery(d *rewrite.Decode) (bool, error) {
	if _, ok := c.mayAnswerQuery(); !ok {
		return false, nil
	}
	out := appendDecodeDescription(c.sess.outBuf[:0], false)
	out, ok := c.decodeRow(out, d, d.ID, false)
	if !ok {
		return false, nil
	}
	return true, c.answerQuery(appendCommandComplete(out, "SELECT 1"))
}

// decodeParamTypes returns the parameter types of a leaf_decode statement as the server
// reports them: the client's, or int8 for the ID left unspecified (the rewritten text
// casts it). complete is false when another parameter has no type.
func decodeParamTypes(d *rewrite.Decode, maxParam int, oids []byte) (types []uint32, complete bool) {
	types = make([]uint32, max(len(oids)/4, maxParam))
	complete = true
	for i := range types {
		if 4*i+4 <= len(oids) {
			types[i] = binary.BigEndian.Uint32(oids[4*i:])
		}
		if types[i] == 0 {
			if i+1 != d.Param {
				complete = false
			}
			types[i] = oidInt8
		}
	}
	return types, complete
}

// decodeArg reads the ID of a local leaf_decode portal from its Bind, reporting false when
// the server should judge the value (not an integer as it would read it).
func decodeArg(d *rewrite.Decode, types []uint32, m *bindMessage) (id int64, ok bool, err error) {
	if d.Param == 0 {
		return d.ID, true, nil
	}
	v := m.params[d.Param-1]
	if v == nil {
		return 0, true, &rewrite.Error{Code: sqlstate.InvalidParameterValue,
			Message: fmt.Sprintf("the ID passed to leaf_decode() in parameter $%d is NULL", d.Param)}
	}
	switch t := types[d.Param-1]; {
	case t == oidInt8 && m.format(d.Param-1) == 1 && len(v) == 8:
		id = int64(binary.BigEndian.Uint64(v))
	case (t == oidInt8 || t == oidInt4) && m.format(d.Param-1) == 0:
		n, perr := strconv.ParseInt(string(v), 10, 64)
		if perr != nil || (t == oidInt4 && int64(int32(n)) != n) {
			return 0, false, nil
		}
		id = n
	default:
		return 0, false, nil
	}
	if id < 0 {
		return 0, true, &rewrite.Error{Code: sqlstate.InvalidParameterValue,
			Message: fmt.Sprintf("%d is not a snowflake ID: IDs are not negative", id)}
	}
	return id, true, nil
}
