package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/httpapi"
)

func decodeCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("decode", "decode [--config FILE] [--snowflake-epoch MS] ID...\n\nPrints each snowflake ID split into timestamp (Unix ms), time, worker and sequence, one JSON object per line.", stderr)
	file := fs.String("config", "", "read snowflake-epoch from this configuration `FILE` (env LEAFPROXY_CONFIG)")
	epoch := fs.Int64("snowflake-epoch", 0, fmt.Sprintf("snowflake epoch in Unix milliseconds (env LEAFPROXY_SNOWFLAKE_EPOCH; default %d, Leaf's)", config.DefaultSnowflakeEpoch))
	ids, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		fs.Usage()
		return usageError("decode: no ID given")
	}
	// The same precedence as serve: flag, then environment, then file, then default.
	c := config.Defaults()
	if *file == "" {
		*file = os.Getenv("LEAFPROXY_CONFIG")
	}
	if *file != "" {
		if c, err = config.ReadFile(*file); err != nil {
			return err
		}
	}
	if v := os.Getenv("LEAFPROXY_SNOWFLAKE_EPOCH"); v != "" {
		if c.SnowflakeEpoch, err = strconv.ParseInt(v, 10, 64); err != nil {
			return usageError("LEAFPROXY_SNOWFLAKE_EPOCH: %q is not an integer", v)
		}
	}
	if flagGiven(fs, "snowflake-epoch") {
		c.SnowflakeEpoch = *epoch
	}
	codec, err := snowflake.NewCodec(snowflake.Layout{}, time.UnixMilli(c.SnowflakeEpoch))
	if err != nil {
		return usageError("decode: %v", err)
	}
	enc := json.NewEncoder(stdout)
	for _, raw := range ids {
		id, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || id < 0 {
			return usageError("decode: %q is not a non-negative 64-bit integer", raw)
		}
		if err := enc.Encode(decoded(codec, id)); err != nil {
			return err
		}
	}
	return nil
}

// decoded splits id for `leafproxy decode` and /decodeSnowflakeId alike.
func decoded(codec snowflake.Codec, id int64) httpapi.Decoded {
	p := codec.Decompose(id)
	return httpapi.Decoded{
		ID: id, Timestamp: p.Millis, Time: p.Time.UTC(), Worker: p.Worker, Sequence: p.Sequence,
		WorkerID: strconv.FormatInt(p.Worker, 10), SequenceID: strconv.FormatInt(p.Sequence, 10),
	}
}
