package httpapi

import "net/http"

// pools serves /pools: the figures of every pool of server connections, as JSON
// ({"pools": [...]}, in the words of PgBouncer's SHOW POOLS and SHOW STATS).
func (s *server) pools(w http.ResponseWriter, r *http.Request) {
	if s.Pools == nil {
		unavailable("pool figures are not configured")(w, r)
		return
	}
	writeJSON(w, map[string]any{"pools": s.Pools()})
}
