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
		d := decoded(codec, id)
		if d.Warning != "" {
			fmt.Fprintf(stderr, "leafproxy: warning: %d %s\n", id, d.Warning)
		}
		if err := enc.Encode(d); err != nil {
			return err
		}
	}
	return nil
}

// decoded splits id for `leafproxy decode` and /decodeSnowflakeId alike, with a warning
// when the value cannot be a snowflake ID of this layout and epoch.
func decoded(codec snowflake.Codec, id int64) httpapi.Decoded {
	p := codec.Decompose(id)
	return httpapi.Decoded{
		ID: id, Timestamp: p.Millis, Time: p.Time.UTC(), Worker: p.Worker, Sequence: p.Sequence,
		WorkerID: strconv.FormatInt(p.Worker, 10), SequenceID: strconv.FormatInt(p.Sequence, 10),
		Warning: notASnowflake(codec.Epoch(), p.Time, time.Now()),
	}
}

// futureSlack lets an ID from a host whose clock runs slightly ahead decode without a
// warning.
const futureSlack = time.Minute

// notASnowflake says why an ID whose time decodes to at cannot be a snowflake ID: no
// engine issued IDs within a day of the epoch (small numbers, such as segment IDs, decode
// to there), and none issued IDs in the future.
func notASnowflake(epoch, at, now time.Time) string {
	switch {
	case at.Before(epoch.Add(24 * time.Hour)):
		return fmt.Sprintf("cannot be a snowflake ID of this layout: its time %s is less than a day after the epoch %s (a segment ID?)",
			at.UTC().Format(time.RFC3339), epoch.UTC().Format(time.RFC3339))
	case at.After(now.Add(futureSlack)):
		return fmt.Sprintf("cannot be a snowflake ID of this layout: its time %s is in the future (another epoch or layout?)",
			at.UTC().Format(time.RFC3339))
	}
	return ""
}
