package proxy

import (
	"fmt"

	"github.com/leafproxy/leafproxy/rewrite"
)

// bindDecode checks the ID a Bind passes to SELECT leaf_decode($n) and forwards the Bind:
// a NULL or negative ID is 22023, as a literal one is when planned. A value that is no
// integer at all is the server's to report, as for any int8 parameter.
func (c *conn) bindDecode(d *rewrite.Decode, body []byte) error {
	m, _, ok := parseBind(body)
	if !ok || d.Param > len(m.params) || (len(m.formats) > 1 && len(m.formats) != len(m.params)) {
		return c.forwardExtended('B', body) // the server reports the malformed Bind
	}
	v := m.params[d.Param-1]
	if v == nil {
		return c.refuseExtended(&rewrite.Error{Code: rewrite.CodeInvalidParameter,
			Message: fmt.Sprintf("the ID passed to leaf_decode() in parameter $%d is NULL", d.Param)}, false)
	}
	if id, err := bindInt(v, m.format(d.Param-1), 0); err == nil && id < 0 {
		return c.refuseExtended(&rewrite.Error{Code: rewrite.CodeInvalidParameter,
			Message: fmt.Sprintf("%d is not a snowflake ID: IDs are not negative", id)}, false)
	}
	return c.forwardExtended('B', body)
}
