package seq

import (
	"errors"
	"fmt"
	"time"
)

// Layout is the bit split and epoch of a deployment's time-ordered IDs:
// from the top bit down, 0 | milliseconds since the epoch | worker | sequence.
// Every worker and decoder of a deployment uses the same layout.
type Layout struct {
	EpochMs      int64 // Unix milliseconds of the epoch
	TimeBits     uint
	WorkerBits   uint
	SequenceBits uint
}

// DefaultLayout is the workers' default: 41/10/12 bits (the Twitter/Leaf
// split) and the epoch 2024-01-01T00:00:00Z.
var DefaultLayout = Layout{EpochMs: 1704067200000, TimeBits: 41, WorkerBits: 10, SequenceBits: 12}

// Check says what is wrong with a layout, in the workers' own terms.
func (l Layout) Check() error {
	switch {
	case l.TimeBits+l.WorkerBits+l.SequenceBits != 63:
		return fmt.Errorf("seq: time, worker and sequence bits must add up to 63, got %d+%d+%d",
			l.TimeBits, l.WorkerBits, l.SequenceBits)
	case l.TimeBits < 32:
		return errors.New("seq: time bits must be at least 32")
	case l.WorkerBits < 1 || l.WorkerBits > 16:
		return errors.New("seq: worker bits must be from 1 to 16")
	case l.SequenceBits < 1 || l.SequenceBits > 22:
		return errors.New("seq: sequence bits must be from 1 to 22")
	case l.EpochMs < 0:
		return errors.New("seq: the epoch must not be before 1970")
	}
	return nil
}

// Decoded is a time-ordered ID split into its parts.
type Decoded struct {
	ID       uint64
	Time     time.Time // when the ID was made (UTC, millisecond precision)
	Ms       int64     // milliseconds since the layout's epoch
	Worker   uint64
	Sequence uint64
}

// Decode splits a time-ordered ID made by a seq snowflake worker with layout l.
func Decode(id uint64, l Layout) (Decoded, error) {
	if err := l.Check(); err != nil {
		return Decoded{}, err
	}
	if id >= 1<<63 {
		return Decoded{}, errors.New("seq: an ID is an integer from 0 to 2**63-1")
	}
	seq := id & (1<<l.SequenceBits - 1)
	worker := (id >> l.SequenceBits) & (1<<l.WorkerBits - 1)
	ms := int64(id >> (l.WorkerBits + l.SequenceBits))
	return Decoded{
		ID: id, Ms: ms, Worker: worker, Sequence: seq,
		Time: time.UnixMilli(l.EpochMs + ms).UTC(),
	}, nil
}
