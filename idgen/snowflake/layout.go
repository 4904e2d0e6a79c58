package snowflake

import (
	"errors"
	"fmt"
	"time"
)

// DefaultEpochMillis is Leaf's and Twitter's epoch: 2010-11-04 01:42:54.657 UTC.
const DefaultEpochMillis int64 = 1288834974657

// DefaultLayout is Leaf's layout: 41 bits of milliseconds, 10 of worker, 12 of sequence.
// It is informational: the engine uses its own copy, so changing it changes nothing.
var DefaultLayout = Layout{TimeBits: defaultTimeBits, WorkerBits: defaultWorkerBits, SequenceBits: defaultSequenceBits}

const (
	defaultTimeBits     = 41
	defaultWorkerBits   = 10
	defaultSequenceBits = 12
)

// ErrBadLayout: the bit layout or epoch of the settings is invalid.
var ErrBadLayout = errors.New("snowflake: invalid layout")

// Layout splits the 63 usable bits of an ID (the sign bit stays 0) into milliseconds since
// the epoch, worker ID and sequence, from most to least significant. The zero Layout means
// DefaultLayout.
type Layout struct {
	TimeBits     int
	WorkerBits   int
	SequenceBits int
}

// String renders the layout as "41/10/12".
func (l Layout) String() string {
	return fmt.Sprintf("%d/%d/%d", l.TimeBits, l.WorkerBits, l.SequenceBits)
}

func (l Layout) orDefault() Layout {
	if l == (Layout{}) {
		return Layout{TimeBits: defaultTimeBits, WorkerBits: defaultWorkerBits, SequenceBits: defaultSequenceBits}
	}
	return l
}

// Validate reports whether every part has at least one bit and the parts use exactly the
// 63 bits below the sign bit.
func (l Layout) Validate() error {
	if l.TimeBits < 1 || l.WorkerBits < 1 || l.SequenceBits < 1 {
		return fmt.Errorf("%w: %s: every part needs at least one bit", ErrBadLayout, l)
	}
	if sum := l.TimeBits + l.WorkerBits + l.SequenceBits; sum != 63 {
		return fmt.Errorf("%w: %s uses %d bits, want 63", ErrBadLayout, l, sum)
	}
	return nil
}

// MaxWorker is the largest worker ID the layout can hold.
func (l Layout) MaxWorker() int64 { return 1<<l.WorkerBits - 1 }

// MaxSequence is the largest sequence number the layout can hold.
func (l Layout) MaxSequence() int64 { return 1<<l.SequenceBits - 1 }

// MaxElapsed is the last millisecond after the epoch the layout can hold.
func (l Layout) MaxElapsed() int64 { return 1<<l.TimeBits - 1 }

// Parts are the fields of one ID.
type Parts struct {
	Time     time.Time // the millisecond the ID was made in (UTC)
	Millis   int64     // the same as Unix milliseconds
	Worker   int64
	Sequence int64
}

// Codec composes and decomposes IDs of one layout and epoch. The zero Codec is not valid;
// use NewCodec or DefaultCodec.
type Codec struct {
	layout      Layout
	epochMillis int64
}

// DefaultCodec decodes IDs of Leaf's default layout and epoch.
func DefaultCodec() Codec {
	return Codec{layout: Layout{}.orDefault(), epochMillis: DefaultEpochMillis}
}

// NewCodec validates the layout (the zero Layout means DefaultLayout) and returns a codec
// for IDs counted from epoch (the zero time means DefaultEpochMillis).
func NewCodec(layout Layout, epoch time.Time) (Codec, error) {
	layout = layout.orDefault()
	if err := layout.Validate(); err != nil {
		return Codec{}, err
	}
	ms := DefaultEpochMillis
	if !epoch.IsZero() {
		ms = epoch.UnixMilli()
	}
	if ms < 0 {
		return Codec{}, fmt.Errorf("%w: epoch %v is before 1970", ErrBadLayout, epoch)
	}
	return Codec{layout: layout, epochMillis: ms}, nil
}

// Layout returns the codec's layout.
func (c Codec) Layout() Layout { return c.layout }

// Epoch returns the codec's epoch.
func (c Codec) Epoch() time.Time { return time.UnixMilli(c.epochMillis).UTC() }

// EpochMillis returns the codec's epoch in Unix milliseconds.
func (c Codec) EpochMillis() int64 { return c.epochMillis }

// Decompose splits id into its parts. Negative IDs (sign bit set) are not produced by
// any layout; their parts are meaningless.
func (c Codec) Decompose(id int64) Parts {
	l := c.layout
	seq := id & l.MaxSequence()
	w := (id >> l.SequenceBits) & l.MaxWorker()
	elapsed := id >> (l.SequenceBits + l.WorkerBits)
	ms := c.epochMillis + elapsed
	return Parts{Time: time.UnixMilli(ms).UTC(), Millis: ms, Worker: w, Sequence: seq}
}

// Compose builds the ID of the given parts. Millis wins over Time when both are set.
func (c Codec) Compose(p Parts) (int64, error) {
	ms := p.Millis
	if ms == 0 {
		ms = p.Time.UnixMilli()
	}
	l := c.layout
	elapsed := ms - c.epochMillis
	switch {
	case elapsed < 0 || elapsed > l.MaxElapsed():
		return 0, fmt.Errorf("%w: time %d ms is outside the %d time bits after the epoch", ErrBadLayout, ms, l.TimeBits)
	case p.Worker < 0 || p.Worker > l.MaxWorker():
		return 0, fmt.Errorf("%w: worker %d is outside 0..%d", ErrBadLayout, p.Worker, l.MaxWorker())
	case p.Sequence < 0 || p.Sequence > l.MaxSequence():
		return 0, fmt.Errorf("%w: sequence %d is outside 0..%d", ErrBadLayout, p.Sequence, l.MaxSequence())
	}
	return c.compose(elapsed, p.Worker, p.Sequence), nil
}

// compose packs already validated fields.
func (c Codec) compose(elapsed, worker, seq int64) int64 {
	return elapsed<<(c.layout.SequenceBits+c.layout.WorkerBits) | worker<<c.layout.SequenceBits | seq
}
